import type { BucketPolicy } from '../rate-limit.interfaces.js';
import { MAX_CAPACITY, MAX_WINDOW_SECONDS } from '../stores/token-bucket.js';
import { keysOf, unknownKeyOf } from '../unknown-keys.js';
import { RateLimitConfigError } from '../errors/rate-limit.errors.js';

/** The checks of bucket numbers, for `BucketService`, `ConnectionRateLimit` and the route policies alike. */

const BUCKET_POLICY_KEYS = keysOf<keyof BucketPolicy>({ capacity: true, refillPerSecond: true });

/** A value as an error message shows it. */
export function describe(value: unknown): string {
  if (typeof value === 'function') return value.name ? `${value.name} (a function)` : 'a function';
  return typeof value === 'string' ? JSON.stringify(value) : String(value);
}

/** A value in a message, without calling anything of it (an object may have no toString). */
export function describeValue(value: unknown): string {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'an array';
  switch (typeof value) {
    case 'string':
      return JSON.stringify(value);
    case 'object':
      return 'an object';
    case 'function':
      return 'a function';
    case 'symbol':
      return 'a symbol';
    case 'bigint':
      return `${value}n`;
    default:
      return String(value);
  }
}

/**
 * Checks the bucket numbers; `where` names the route or call in the error. Bounds: capacity an integer
 * from 1 to `MAX_CAPACITY` (1e12), refill finite and > 0, and the window capacity / refill at most
 * `MAX_WINDOW_SECONDS` (1e12 s): numbers for which the arithmetic stays exact and the script's
 * PEXPIRE argument is an integer Redis accepts.
 */
export function assertBucketPolicy(policy: BucketPolicy, where: string, label = '@RateLimit'): void {
  if (typeof policy !== 'object' || policy === null) {
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_INVALID_POLICY',
      `${label} needs { capacity, refillPerSecond } (got ${describe(policy)}) on ${where}`,
    );
  }
  const { capacity, refillPerSecond } = policy;
  if (typeof capacity !== 'number' || !Number.isInteger(capacity) || capacity < 1) {
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_INVALID_POLICY',
      `${label} capacity must be an integer >= 1 (got ${describe(capacity)}) on ${where}`,
    );
  }
  if (capacity > MAX_CAPACITY) {
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_INVALID_POLICY',
      `${label} capacity must be at most ${MAX_CAPACITY} (got ${describe(capacity)}) on ${where}`,
    );
  }
  if (typeof refillPerSecond !== 'number' || !Number.isFinite(refillPerSecond) || refillPerSecond <= 0) {
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_INVALID_POLICY',
      `${label} refillPerSecond must be a finite number > 0 (got ${describe(refillPerSecond)}) on ${where}`,
    );
  }
  // The time an empty bucket takes to fill; the bucket's TTL is twice it (see MAX_WINDOW_SECONDS).
  const window = capacity / refillPerSecond;
  if (!(window <= MAX_WINDOW_SECONDS)) {
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_INVALID_POLICY',
      `${label} window capacity / refillPerSecond must be at most ${MAX_WINDOW_SECONDS} s (got ${Number(window.toPrecision(6))} s) on ${where}`,
    );
  }
}

/**
 * Checks a `BucketService` policy: only `capacity` and `refillPerSecond` (plus `extraKeys`), so that a
 * route policy's `keyBy` or `cost` passed here by mistake is refused instead of ignored; then its numbers.
 */
export function assertServicePolicy(policy: BucketPolicy, where: string, extraKeys: readonly string[] = []): void {
  // On every BucketService call: no array built for the usual one.
  const known = extraKeys.length === 0 ? BUCKET_POLICY_KEYS : [...BUCKET_POLICY_KEYS, ...extraKeys];
  const unknown = unknownKeyOf(policy, known, 'the policy');
  if (unknown !== undefined) throw new RateLimitConfigError('ERR_RATE_LIMIT_UNKNOWN_OPTION', `BucketService ${unknown} on ${where}`);
  assertBucketPolicy(policy, where, 'BucketService');
}

/** Checks a cost against its bucket. */
export function assertCost(cost: unknown, capacity: number, where: string, label = '@RateLimit'): void {
  if (typeof cost !== 'number' || !Number.isInteger(cost) || cost < 1 || cost > capacity) {
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_INVALID_POLICY',
      `${label} cost must be an integer from 1 to capacity ${capacity} (got ${describe(cost)}) on ${where}`,
    );
  }
}
