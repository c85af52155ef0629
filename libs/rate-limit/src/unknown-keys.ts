/**
 * Options are strict: a key the library does not read is a mistake (a typo, a copy from another
 * library's options, a policy kept in a variable that TypeScript's excess-property check never saw), and
 * ignoring it silently leaves the default in force. These helpers find such keys and name the known key
 * that was probably meant.
 */

/** Every key of every member of a union type (`keyof` alone gives only the keys they share). */
export type AllKeys<T> = T extends unknown ? keyof T : never;

/** Edit distance of two short words (option names), a swap of two neighbours counting as one edit. */
export function editDistance(a: string, b: string): number {
  const d = Array.from({ length: a.length + 1 }, (_, i) => Array.from({ length: b.length + 1 }, (_, j) => (i === 0 ? j : j === 0 ? i : 0)));
  for (let i = 1; i <= a.length; i++) {
    for (let j = 1; j <= b.length; j++) {
      const substitution = a[i - 1] === b[j - 1] ? 0 : 1;
      d[i][j] = Math.min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + substitution);
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1]) d[i][j] = Math.min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.length][b.length];
}

/**
 * The known key `key` was probably meant to be: one that differs only in case first, else the closest
 * by edit distance when it is close enough (at most a third of the key's length, at least 1), else
 * undefined. `mistaken` maps names people write for another library's option to ours (`hostname` → `host`).
 */
export function nearestKey(key: string, known: Iterable<string>, mistaken: Record<string, string> = {}): string | undefined {
  if (Object.hasOwn(mistaken, key)) return mistaken[key];
  const lower = key.toLowerCase();
  let best: string | undefined;
  let bestDistance = Infinity;
  for (const candidate of known) {
    if (candidate.toLowerCase() === lower) return candidate;
    const d = editDistance(lower, candidate.toLowerCase());
    if (d < bestDistance) [best, bestDistance] = [candidate, d];
  }
  return bestDistance <= Math.max(1, Math.floor(key.length / 3)) ? best : undefined;
}

/**
 * The first own key of `value` that is not in `known`, described for an error message:
 * `unknown key "failuremode" in the options (did you mean "failureMode"?)`, or with the known keys
 * listed when none is close. Undefined when every key is known (or `value` is not an object).
 */
export function unknownKeyOf(
  value: unknown,
  known: readonly string[],
  where: string,
  mistaken: Record<string, string> = {},
): string | undefined {
  if (typeof value !== 'object' || value === null) return undefined;
  for (const key of Object.keys(value)) {
    if (known.includes(key)) continue;
    const near = nearestKey(key, known, mistaken);
    const hint = near !== undefined ? `did you mean "${near}"?` : `known keys: ${known.join(', ')}`;
    return `unknown key ${JSON.stringify(key)} in ${where} (${hint})`;
  }
  return undefined;
}

/** The keys of a `Record<K, true>` written out for the compiler to check against an interface: exactly its keys. */
export function keysOf<K extends string>(record: Record<K, true>): readonly K[] {
  return Object.keys(record) as K[];
}
