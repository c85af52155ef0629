import { RateLimitConfigError } from '../errors/rate-limit.errors.js';
import { DEFAULT_ACQUIRE_MAX_WAIT_MS } from '../rate-limit.constants.js';
import type { BucketPolicy } from '../rate-limit.interfaces.js';
import type { FailureMode, ResolvedRateLimitOptions } from '../rate-limit.options.js';
import { MAX_CAPACITY } from '../stores/token-bucket.js';
import { keysOf, unknownKeyOf } from '../unknown-keys.js';
import { describe } from './bucket-policy.check.js';
import type { AcquireCall } from './waiting-room.js';

/** Options of one `BucketService.acquire()` call. */
export interface AcquireOptions {
  /** Tokens to wait for; default 1 (an integer from 1 to the capacity). */
  cost?: number;
  /**
   * The longest this call may wait, in ms: when its turn would come later, it rejects at once with
   * `RateLimitWaitTooLongError` and reserves nothing. At most, and by default, the module's `acquire.maxWaitMs` (60,000).
   */
  maxWaitMs?: number;
  /** Aborting it before the call's turn rejects the call (an `AbortError`, `cause`: the signal's reason) and gives its tokens back. */
  signal?: AbortSignal;
  /** What the call gets when Redis fails or times out; default the module's `failureMode`. */
  failureMode?: FailureMode;
}

const ACQUIRE_KEYS = keysOf<keyof AcquireOptions>({ cost: true, maxWaitMs: true, signal: true, failureMode: true });
const FAILURE_MODES: readonly FailureMode[] = ['open', 'closed', 'local'];

/**
 * The longest wait the store may bound a bucket of refill `refillPerSecond` by (its `w`): the module's
 * `acquire.maxWaitMs`, or less for a refill so fast that more than `MAX_CAPACITY` tokens would refill
 * meanwhile (the script refuses that).
 */
export function waitBoundMs(moduleMaxWaitMs: number, refillPerSecond: number): number {
  let bound = moduleMaxWaitMs;
  while (bound > 0 && !((bound * refillPerSecond) / 1000 <= MAX_CAPACITY)) {
    bound = Math.floor(((MAX_CAPACITY * 1000) / refillPerSecond) * (1 - 1e-9));
  }
  return bound;
}

/** Checks the options of an `acquire()` call and turns them into the waiting room's numbers. */
export function acquireCall(name: string, policy: BucketPolicy, options: AcquireOptions, module: ResolvedRateLimitOptions): AcquireCall {
  const where = `BucketService.acquire("${name}")`;
  if (typeof options !== 'object' || options === null) {
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_INVALID_OPTION',
      `${where}: options must be { cost?, maxWaitMs?, signal?, failureMode? } (got ${describe(options)})`,
    );
  }
  const unknown = unknownKeyOf(options, ACQUIRE_KEYS, 'the options');
  if (unknown !== undefined) throw new RateLimitConfigError('ERR_RATE_LIMIT_UNKNOWN_OPTION', `${where}: ${unknown}`);
  const most = module.acquireMaxWaitMs ?? DEFAULT_ACQUIRE_MAX_WAIT_MS;
  const { maxWaitMs = most, signal, failureMode = module.failureMode } = options;
  if (typeof maxWaitMs !== 'number' || !(maxWaitMs >= 0) || maxWaitMs > most) {
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_INVALID_OPTION',
      `${where}: maxWaitMs must be a number from 0 to the module's acquire.maxWaitMs ${most} (got ${describe(maxWaitMs)})`,
    );
  }
  if (signal !== undefined && !(signal instanceof AbortSignal)) {
    throw new RateLimitConfigError('ERR_RATE_LIMIT_INVALID_OPTION', `${where}: signal must be an AbortSignal (got ${describe(signal)})`);
  }
  if (!FAILURE_MODES.includes(failureMode)) {
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_INVALID_OPTION',
      `${where}: failureMode must be 'open', 'closed' or 'local' (got ${describe(failureMode)})`,
    );
  }
  const refill = typeof policy?.refillPerSecond === 'number' && policy.refillPerSecond > 0 ? policy.refillPerSecond : 1;
  const boundMs = waitBoundMs(most, refill);
  return { name, maxWaitMs: Math.min(maxWaitMs, boundMs), boundMs, signal, failureMode };
}
