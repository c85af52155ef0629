import { describe } from '../bucket/bucket-policy.check.js';
import { RateLimitConfigError } from '../errors/rate-limit.errors.js';
import type { KeyBy } from '../rate-limit.interfaces.js';
import { SAFE_IDENTITY } from '../rate-limit.constants.js';
import { DEFAULT_SLOT_LEASE_MS, MAX_SLOT_LEASE_MS, MAX_SLOT_WAIT_MS, MAX_SLOTS, MIN_SLOT_LEASE_MS } from '../stores/slots.js';
import { type AllKeys, keysOf, unknownKeyOf } from '../unknown-keys.js';

/** `@ConcurrencyLimit({ ... })`: at most `limit` requests of one identity in flight at once, on every instance. */
export interface ConcurrencyLimitOptions {
  /** The most requests of one identity in flight at once: an integer from 1 to 10,000. */
  limit: number;
  /** Whose requests are counted together: as `@RateLimit`'s keyBy. Default `'ip'`. */
  keyBy?: KeyBy;
  /** The slots' name (routes with one name share their slots). Default: `Controller.handler`. */
  name?: string;
  /**
   * How long a slot is held without a renewal (ms, 100 to 3,600,000): a request that runs longer renews
   * its slot every third of it; a slot whose instance died is free after at most this. Default 30,000.
   */
  leaseMs?: number;
  /**
   * Wait up to this long (ms) for a slot when all are in use, instead of refusing at once. Default 0.
   * Waiters on one instance are served in order, a slot given back on that instance going straight to
   * the first of them; slots freed on other instances are found by asking again (see the guide).
   */
  maxWaitMs?: number;
}

/** A route's concurrency limit, checked once at start-up. */
export interface CompiledConcurrency {
  limit: number;
  keyBy: KeyBy;
  /** The name, or `Controller.handler`. */
  scope: string;
  /** What follows the identity in the slots' key: `}!<scope>` (a bucket's is `}:<scope>`, so the two never meet). */
  keySuffix: string;
  leaseMs: number;
  maxWaitMs: number;
}

const KEYS = keysOf<AllKeys<ConcurrencyLimitOptions>>({ limit: true, keyBy: true, name: true, leaseMs: true, maxWaitMs: true });
const KEY_BY_NAMES: readonly string[] = ['ip', 'user', 'apiKey'];

function invalid(message: string, route: string): never {
  throw new RateLimitConfigError('ERR_RATE_LIMIT_INVALID_POLICY', `@ConcurrencyLimit ${message} on ${route}`);
}

/** Checks a `@ConcurrencyLimit` of `route`: a mistake stops the start, naming the route. */
export function compileConcurrency(options: ConcurrencyLimitOptions, route: string): CompiledConcurrency {
  if (typeof options !== 'object' || options === null) invalid(`takes a limit or { limit, ... } (got ${describe(options)})`, route);
  const unknown = unknownKeyOf(options, KEYS, 'the options');
  if (unknown !== undefined) throw new RateLimitConfigError('ERR_RATE_LIMIT_UNKNOWN_OPTION', `@ConcurrencyLimit ${unknown} on ${route}`);
  const { limit, name } = options;
  if (typeof limit !== 'number' || !Number.isInteger(limit) || limit < 1 || limit > MAX_SLOTS) {
    invalid(`limit must be an integer from 1 to ${MAX_SLOTS} (got ${describe(limit)})`, route);
  }
  const keyBy = options.keyBy ?? 'ip';
  if (typeof keyBy !== 'function' && !KEY_BY_NAMES.includes(keyBy)) {
    invalid(`keyBy must be 'ip', 'user', 'apiKey' or a function (got ${describe(keyBy)})`, route);
  }
  if (name !== undefined && (typeof name !== 'string' || !SAFE_IDENTITY.test(name))) {
    invalid(`name must be 1-64 characters of A-Z a-z 0-9 . _ : @ - (got ${describe(name)})`, route);
  }
  const leaseMs = options.leaseMs ?? DEFAULT_SLOT_LEASE_MS;
  if (typeof leaseMs !== 'number' || !Number.isInteger(leaseMs) || leaseMs < MIN_SLOT_LEASE_MS || leaseMs > MAX_SLOT_LEASE_MS) {
    invalid(`leaseMs must be an integer from ${MIN_SLOT_LEASE_MS} to ${MAX_SLOT_LEASE_MS} (got ${describe(options.leaseMs)})`, route);
  }
  const maxWaitMs = options.maxWaitMs ?? 0;
  if (typeof maxWaitMs !== 'number' || !Number.isInteger(maxWaitMs) || maxWaitMs < 0 || maxWaitMs > MAX_SLOT_WAIT_MS) {
    invalid(`maxWaitMs must be an integer from 0 to ${MAX_SLOT_WAIT_MS} (got ${describe(options.maxWaitMs)})`, route);
  }
  const scope = name ?? route;
  return { limit, keyBy, scope, keySuffix: `}!${scope}`, leaseMs, maxWaitMs };
}
