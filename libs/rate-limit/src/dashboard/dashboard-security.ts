import type { IncomingHttpHeaders } from 'node:http';

/**
 * The dashboard's defences that come before any guard, route or body parser: they run as a middleware
 * on Express and Fastify alike, on the raw request, so that a refused write is never parsed and every
 * answer (a guard's 401 included) carries the headers.
 */

/** The custom header every write carries: a cross-site form cannot set it, and a cross-site fetch that sets it needs a preflight. */
export const DASHBOARD_WRITE_HEADER = 'x-rate-limit-dashboard';

/** The page's policy: its own script and style only, no inline code, no framing, no form posts, no `<base>`. */
export const DASHBOARD_CSP =
  "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; " +
  "base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/** Headers of every answer under the dashboard's path. */
export const DASHBOARD_HEADERS: Readonly<Record<string, string>> = {
  'Cache-Control': 'no-store',
  'X-Content-Type-Options': 'nosniff',
  'Content-Security-Policy': DASHBOARD_CSP,
  'Referrer-Policy': 'no-referrer',
  'X-Frame-Options': 'DENY',
  'Cross-Origin-Resource-Policy': 'same-origin',
};

/** Headers a proxy adds: a request that carries one came through a proxy, so its socket address says nothing. */
const FORWARDED = ['forwarded', 'x-forwarded-for', 'x-real-ip'];

/** Whether the request comes from this machine itself (127.0.0.0/8, ::1, and the mapped form), not through a proxy. */
export function fromLoopback(remoteAddress: string | undefined, headers: IncomingHttpHeaders): boolean {
  if (FORWARDED.some((name) => headers[name] !== undefined)) return false;
  if (remoteAddress === undefined) return false;
  const address = remoteAddress.startsWith('::ffff:') ? remoteAddress.slice(7) : remoteAddress;
  return address === '::1' || /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(address);
}

const JSON_TYPE = /^application\/json\s*(?:;\s*charset\s*=\s*"?utf-8"?\s*)?$/i;

/**
 * Why a write is refused before it is read, or undefined when it may go on: POST only, a JSON body, the
 * custom header, and a browser's `Origin` (or `Sec-Fetch-Site`), when sent, naming this very origin.
 * `Host` is compared with `Origin`'s host and port (a proxy in front must pass `Host` through, as they do
 * by default). Cookies go with a request from another port of the same host (same-site), so a same-site
 * origin is refused as well.
 */
export function refusedWrite(method: string | undefined, headers: IncomingHttpHeaders): string | undefined {
  if (method !== 'POST') return `changes are POST requests (got ${method ?? 'none'})`;
  const type = headers['content-type'];
  if (typeof type !== 'string' || !JSON_TYPE.test(type)) return 'changes need Content-Type: application/json';
  if (headers[DASHBOARD_WRITE_HEADER] !== '1') return `changes need the header ${DASHBOARD_WRITE_HEADER}: 1 (the page sends it)`;
  const site = headers['sec-fetch-site'];
  if (site !== undefined && site !== 'same-origin') return `a change from another site is refused (Sec-Fetch-Site: ${String(site)})`;
  const origin = headers.origin;
  if (origin !== undefined) {
    let host: string | undefined;
    try {
      host = new URL(origin).host;
    } catch {
      host = undefined;
    }
    if (host === undefined || host === '' || host.toLowerCase() !== String(headers.host ?? '').toLowerCase()) {
      return 'a change from another origin is refused (Origin does not name this host)';
    }
  }
  return undefined;
}
