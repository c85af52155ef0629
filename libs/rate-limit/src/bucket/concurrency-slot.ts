/**
 * A concurrency slot as the application sees it (`ConcurrencySlot`), what a take asks for, and the slots
 * that hold nothing (a refusal, `failureMode: 'open'`); `ConcurrencySlots` (concurrency-slots.ts) takes them.
 */
import { RateLimitError } from '../errors/rate-limit.errors.js';
import type { FailureMode } from '../rate-limit.options.js';
import type { Verdict } from '../rate-limit.interfaces.js';

/** Who answered a slot's take: the store, the in-process slots of `failureMode: 'local'`, or `failureMode` itself. */
export type SlotSource = 'store' | 'local' | 'open' | 'closed';

/**
 * A concurrency slot asked for (`BucketService.takeSlot()`, `@ConcurrencyLimit`): held until `release()`
 * (or `await using`), or refused. Releasing twice, or a refused slot, does nothing.
 */
export interface ConcurrencySlot extends AsyncDisposable {
  /** The slot is held: the work may run. */
  readonly held: boolean;
  /**
   * `'store'` (or `'local'` under `failureMode: 'local'`): decided by the slots; `'open'`: the store failed
   * and `failureMode: 'open'` let the work run without a slot; `'closed'`: it failed and refused.
   */
  readonly source: SlotSource;
  /** The most in flight at once. */
  readonly limit: number;
  /** In flight when the store answered, this one included when held (0 when the store did not answer). */
  readonly inFlight: number;
  /**
   * Refused: seconds after which another try may find a slot free. A hint only: slots free when
   * requests finish, which no one knows ahead; it is how long this instance has seen slots of this
   * name held (a moving average), at least 1 and at most until the earliest other lease ends. 0 when held.
   */
  readonly retryAfterSeconds: number;
  /** Gives the slot back (one store call; none when a waiter on this instance takes it over). */
  release(): Promise<void>;
}

/** What a slot take asks for. */
export interface SlotTake {
  /** The slots' key. */
  key: string;
  /** What the moving average of hold times is kept under (a route's scope, a service name). */
  scope: string;
  limit: number;
  leaseMs: number;
  maxWaitMs: number;
  signal?: AbortSignal;
  failureMode: FailureMode;
}

/** A take and a slot decided together (`ConcurrencySlots.takeWith`). */
export interface CombinedTake {
  /** The buckets' verdict: allowed when they had their cost (drained only when the slot is held, or `failureMode` decided). */
  verdict: Verdict;
  /** The slot, held or refused; undefined when the buckets refused and none was asked for. */
  slot: ConcurrencySlot | undefined;
  /** The store refused the slot and left the buckets untouched: nothing of the request's rate to give back. */
  untaken: boolean;
}

/** A refused slot: nothing held, nothing to give back. */
export function refused(take: SlotTake, source: SlotSource, inFlight: number, retryAfterSeconds: number): ConcurrencySlot {
  const release = () => Promise.resolve();
  return { held: false, source, limit: take.limit, inFlight, retryAfterSeconds, release, [Symbol.asyncDispose]: release };
}

/** `failureMode: 'open'` while the store fails: the work runs, and holds nothing to give back. */
export function unlimited(take: SlotTake): ConcurrencySlot {
  const release = () => Promise.resolve();
  return { held: true, source: 'open', limit: take.limit, inFlight: 0, retryAfterSeconds: 0, release, [Symbol.asyncDispose]: release };
}

/** A wait ended by `app.close()`. */
export function shuttingDown(): RateLimitError {
  return new RateLimitError('ERR_RATE_LIMIT_SHUTTING_DOWN', 'the application is closing: the wait for a concurrency slot was ended');
}

/** A store without slots asked for one (start-up refuses `@ConcurrencyLimit` on such a store first). */
export function noSlots(): RateLimitError {
  return new RateLimitError(
    'ERR_RATE_LIMIT_CONCURRENCY_UNSUPPORTED',
    'the store has no concurrency slots (takeSlot and giveBackSlot): use the Redis or memory store for @ConcurrencyLimit and takeSlot()',
  );
}
