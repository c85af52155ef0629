/**
 * The demo's API keys: a fixed list from `API_KEYS` (comma-separated). A real app looks the key up in its
 * database and returns the account it belongs to.
 */
export function apiKeyVerifier(list: string): (request: { headers: Record<string, unknown> }) => string | undefined {
  const known = new Set(
    list
      .split(',')
      .map((key) => key.trim())
      .filter((key) => key !== ''),
  );
  return (request) => {
    const key = request.headers['x-api-key'];
    return typeof key === 'string' && known.has(key) ? key : undefined;
  };
}
