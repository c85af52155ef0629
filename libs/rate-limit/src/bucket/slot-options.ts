import { RateLimitConfigError } from '../errors/rate-limit.errors.js';
import type { FailureMode, ResolvedRateLimitOptions } from '../rate-limit.options.js';
import { DEFAULT_SLOT_LEASE_MS, MAX_SLOT_LEASE_MS, MAX_SLOT_WAIT_MS, MAX_SLOTS, MIN_SLOT_LEASE_MS } from '../stores/slots.js';
import { keysOf, unknownKeyOf } from '../unknown-keys.js';
import { describe } from './bucket-policy.check.js';
import type { SlotTake } from './concurrency-slots.js';

/** Options of `BucketService.takeSlot()` and `withSlot()`. */
export interface SlotOptions {
  /** The most in flight at once under this name, on every instance: an integer from 1 to 10,000. */
  limit: number;
  /** How long a slot is held without a renewal (ms, 100 to 3,600,000): renewed every third of it while held. Default 30,000. */
  leaseMs?: number;
  /** Wait up to this long (ms, at most 600,000) for a slot when all are in use. Default 0: answer at once. */
  maxWaitMs?: number;
  /** Aborting it ends a wait (an `AbortError`); a slot already held stays held until released. */
  signal?: AbortSignal;
  /** What the call gets when Redis fails or times out; default the module's `failureMode`. */
  failureMode?: FailureMode;
}

const SLOT_KEYS = keysOf<keyof SlotOptions>({ limit: true, leaseMs: true, maxWaitMs: true, signal: true, failureMode: true });
const FAILURE_MODES: readonly FailureMode[] = ['open', 'closed', 'local'];

/** Checks the options of a `takeSlot()` / `withSlot()` call: a mistake throws, naming the call. */
export function slotTake(key: string, name: string, options: SlotOptions, module: ResolvedRateLimitOptions, method: string): SlotTake {
  const where = `BucketService.${method}(${JSON.stringify(name)})`;
  const invalid = (message: string): never => {
    throw new RateLimitConfigError('ERR_RATE_LIMIT_INVALID_OPTION', `${where}: ${message}`);
  };
  if (typeof options !== 'object' || options === null) {
    invalid(`options must be { limit, leaseMs?, maxWaitMs?, signal?, failureMode? } (got ${describe(options)})`);
  }
  const unknown = unknownKeyOf(options, SLOT_KEYS, 'the options');
  if (unknown !== undefined) throw new RateLimitConfigError('ERR_RATE_LIMIT_UNKNOWN_OPTION', `${where}: ${unknown}`);
  const { limit, leaseMs = DEFAULT_SLOT_LEASE_MS, maxWaitMs = 0, signal, failureMode = module.failureMode } = options;
  if (typeof limit !== 'number' || !Number.isInteger(limit) || limit < 1 || limit > MAX_SLOTS) {
    invalid(`limit must be an integer from 1 to ${MAX_SLOTS} (got ${describe(limit)})`);
  }
  if (typeof leaseMs !== 'number' || !Number.isInteger(leaseMs) || leaseMs < MIN_SLOT_LEASE_MS || leaseMs > MAX_SLOT_LEASE_MS) {
    invalid(`leaseMs must be an integer from ${MIN_SLOT_LEASE_MS} to ${MAX_SLOT_LEASE_MS} (got ${describe(leaseMs)})`);
  }
  if (typeof maxWaitMs !== 'number' || !Number.isInteger(maxWaitMs) || maxWaitMs < 0 || maxWaitMs > MAX_SLOT_WAIT_MS) {
    invalid(`maxWaitMs must be an integer from 0 to ${MAX_SLOT_WAIT_MS} (got ${describe(maxWaitMs)})`);
  }
  if (signal !== undefined && !(signal instanceof AbortSignal)) invalid(`signal must be an AbortSignal (got ${describe(signal)})`);
  if (!FAILURE_MODES.includes(failureMode)) invalid(`failureMode must be 'open', 'closed' or 'local' (got ${describe(failureMode)})`);
  return { key, scope: name, limit, leaseMs, maxWaitMs, signal, failureMode };
}
