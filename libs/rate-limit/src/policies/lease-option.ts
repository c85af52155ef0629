import { RateLimitConfigError } from '../errors/rate-limit.errors.js';
import { MAX_CAPACITY } from '../stores/token-bucket.js';
import { describe } from '../bucket/bucket-policy.check.js';
import type { LeaseOptions, LeaseSettings } from '../rate-limit.interfaces.js';

export const DEFAULT_LEASE_LIFE_MS = 500;
export const MIN_LEASE_LIFE_MS = 50;
export const MAX_LEASE_LIFE_MS = 10_000;

const LEASE_KEYS: readonly string[] = ['lifeMs', 'maxBatch'];

/** The settings of `option` (undefined: not leased), or a configuration error naming `where`. */
export function resolveLease(option: unknown, where: string, label: string): LeaseSettings | undefined {
  if (option === undefined || option === false) return undefined;
  if (option === true) return { lifeMs: DEFAULT_LEASE_LIFE_MS, maxBatch: undefined };
  const shape = `${label} lease must be true, false or { lifeMs?, maxBatch? }`;
  if (typeof option !== 'object' || option === null || Array.isArray(option)) {
    throw new RateLimitConfigError('ERR_RATE_LIMIT_INVALID_POLICY', `${shape} (got ${describe(option)}) on ${where}`);
  }
  const unknown = Object.keys(option).find((key) => !LEASE_KEYS.includes(key));
  if (unknown !== undefined) {
    throw new RateLimitConfigError('ERR_RATE_LIMIT_UNKNOWN_OPTION', `${label} lease has no option "${unknown}" (${shape}) on ${where}`);
  }
  const { lifeMs = DEFAULT_LEASE_LIFE_MS, maxBatch } = option as LeaseOptions;
  if (!Number.isInteger(lifeMs) || lifeMs < MIN_LEASE_LIFE_MS || lifeMs > MAX_LEASE_LIFE_MS) {
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_INVALID_POLICY',
      `${label} lease.lifeMs must be an integer from ${MIN_LEASE_LIFE_MS} to ${MAX_LEASE_LIFE_MS} (got ${describe(lifeMs)}) on ${where}`,
    );
  }
  if (maxBatch !== undefined && (!Number.isInteger(maxBatch) || maxBatch < 1 || maxBatch > MAX_CAPACITY)) {
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_INVALID_POLICY',
      `${label} lease.maxBatch must be an integer from 1 to ${MAX_CAPACITY} (got ${describe(maxBatch)}) on ${where}`,
    );
  }
  return { lifeMs, maxBatch };
}

/**
 * What a leased policy cannot have, as the reason it is refused at start-up; undefined when it can be
 * leased. A lease spends a batch taken with fixed numbers, so per-request numbers cannot apply to it, and
 * a penalty (`blockSeconds`) starts in the bucket on a refusal that a lease never sees.
 */
export function leaseConflict(policy: { blockSeconds: number; dynamic: unknown; priority?: unknown }): string | undefined {
  if (policy.blockSeconds > 0) {
    return 'blockSeconds (a penalty starts on a refusal in Redis, and a leased decision is made without asking it)';
  }
  if (policy.dynamic !== undefined) {
    return 'numbers computed per request (a batch is leased with the numbers of its first request)';
  }
  // A lease spends its batch without the bucket's tokens at hand: it cannot tell a level its floor.
  if (policy.priority !== undefined) return 'priority or reserve (a leased decision does not see how many tokens the bucket has left)';
  return undefined;
}
