import type { BucketRequest, PenaltyReport } from './token-bucket.js';
import type { BucketStore, TakeOptions, TakeResult } from './bucket-store.interface.js';
import { RateLimitError } from '../errors/rate-limit.errors.js';

/** What a `store` object must have, in the order a start-up error names them. */
const REQUIRED = [
  ['take', 'function', 'take()'],
  ['delete', 'function', 'delete()'],
  ['remote', 'boolean', 'remote (true or false)'],
] as const;
const OPTIONAL = [
  ['abandon', 'abandon() as a function'],
  ['nodeOf', 'nodeOf() as a function'],
] as const;

/** Whether `store` is an object given as the `store` option (rather than 'redis' or 'memory'). */
export function isStoreObject(store: unknown): store is BucketStore {
  return typeof store === 'object' && store !== null && !Array.isArray(store);
}

/** What `store` lacks to be a `BucketStore` ('take() and remote (true or false)'), or undefined when it is one. */
export function missingStoreMembers(store: object): string | undefined {
  const members = store as Record<string, unknown>;
  const missing: string[] = REQUIRED.filter(([name, type]) => typeof members[name] !== type).map(([, , what]) => what);
  for (const [name, what] of OPTIONAL) if (members[name] !== undefined && typeof members[name] !== 'function') missing.push(what);
  if (missing.length === 0) return undefined;
  return missing.length === 1 ? missing[0] : `${missing.slice(0, -1).join(', ')} and ${missing[missing.length - 1]}`;
}

/**
 * A store the application passed in, as the module uses it. A thin layer, so that what the module
 * relies on holds whatever the store does: a call that throws synchronously or answers something that
 * is not a `TakeResult` becomes a rejection (and so follows `failureMode`); a remote store that never
 * calls `sent` is timed from the end of the turn its call was made in (never untimed); and the module's
 * provider is this object, so Nest never runs the application's store's lifecycle hooks a second time
 * (the application owns the store, as it owns a Redis client it passes in).
 */
export class CustomBucketStore implements BucketStore {
  readonly remote: boolean;
  readonly nodeOf: ((key: string) => string | undefined) | undefined;

  constructor(private readonly store: BucketStore) {
    this.remote = store.remote;
    this.nodeOf = store.nodeOf === undefined ? undefined : (key) => store.nodeOf!(key);
  }

  take(requests: readonly BucketRequest[], options?: TakeOptions): Promise<TakeResult & PenaltyReport> {
    const sent = options?.sent;
    let called = sent === undefined;
    const handed = sent && { ...options, sent: () => ((called = true), sent()) };
    let reply: Promise<TakeResult & PenaltyReport>;
    try {
      reply = Promise.resolve(this.store.take(requests, handed ?? options));
    } catch (error) {
      return Promise.reject(error);
    }
    // Later calls of `sent` are ignored: the store's own call, when it comes first, sets the deadline.
    if (!called) setImmediate(sent!);
    return reply.then((result) => checked(result, requests.length));
  }

  delete(keys: readonly string[]): Promise<void> {
    try {
      return Promise.resolve(this.store.delete(keys)).then(() => undefined);
    } catch (error) {
      return Promise.reject(error);
    }
  }

  abandon(): void {
    this.store.abandon?.();
  }
}

/** The reply when it has the shape the module reads; else a TypeError, so that the call counts as failed. */
function checked(result: TakeResult & PenaltyReport, n: number): TakeResult & PenaltyReport {
  const tokens = (result as Partial<TakeResult> | null)?.tokens;
  const penaltyMs = result?.penaltyMs;
  if (
    typeof result?.allowed !== 'boolean' ||
    !Array.isArray(tokens) ||
    tokens.length !== n ||
    !tokens.every((t) => typeof t === 'number' && !Number.isNaN(t)) ||
    (penaltyMs !== undefined &&
      (!Array.isArray(penaltyMs) || penaltyMs.length !== n || !penaltyMs.every((ms) => typeof ms === 'number' && ms >= 0)))
  ) {
    throw new RateLimitError(
      'ERR_RATE_LIMIT_STORE_CONTRACT',
      `BucketStore: take() must answer { allowed: boolean, tokens: number[] } with one number per request (${n}); got ${describe(result)}`,
    );
  }
  return result;
}

function describe(value: unknown): string {
  try {
    const text = JSON.stringify(value);
    return text === undefined ? String(value) : text.length > 200 ? `${text.slice(0, 200)}…` : text;
  } catch {
    return String(value);
  }
}
