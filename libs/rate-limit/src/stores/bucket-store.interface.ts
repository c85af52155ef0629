import type { BucketRequest } from './token-bucket.js';

/** The outcome of one atomic decision over one or more buckets. */
export interface TakeResult {
  /** True when every bucket had its cost and all were drained; false when none was touched. */
  allowed: boolean;
  /** Tokens each bucket holds afterwards, in request order (fractional). */
  tokens: number[];
  /** A reservation's answer (`TakeOptions.reserve`): ms from the store's now until its turn (also when refused). */
  waitMs?: number;
  /**
   * A reservation's answer, optional: the store's clock (ms since the epoch) when it decided, so that the
   * caller's turn is `nowMs + waitMs` by that clock (the Redis store answers Redis TIME).
   */
  nowMs?: number;
}

/** A reservation (`BucketService.acquire()`): see rule 9 of `BucketStore`. */
export interface ReserveOptions {
  /** The call's longest wait (ms): a longer one is refused, and nothing is taken. */
  maxWaitMs: number;
  /** The longest wait any call may have (ms, the module's `acquire.maxWaitMs`): stored as the bucket's `w`. */
  boundMs: number;
}

/** A reservation, as its answer described it: what a give-back names (rule 3). */
export interface ReservationMark {
  /** The tokens its bucket held after it (`TakeResult.tokens[0]`). */
  tokens: number;
  /** The store's clock when it was made (`TakeResult.nowMs`). */
  nowMs: number;
}

export interface TakeOptions {
  /** Compute without taking anything (peek): nothing is written, not even a penalty. */
  dryRun?: boolean;
  /** Give each bucket its cost back (capped at capacity), e.g. a take that a later refusal undoes. Always allowed. */
  refund?: boolean;
  /** Reserve the cost of the one bucket of the call, to be used after `waitMs` (rule 9). */
  reserve?: ReserveOptions;
  /** With `refund`: the reservation this refund gives back, as its answer described it (rule 3). */
  givesBack?: ReservationMark;
  /**
   * Clock override in ms, for deterministic tests only (the conformance suite drives time with it).
   * Default: the store's clock (Redis TIME).
   */
  now?: number;
  /**
   * A remote store calls this when the call is handed to its client (written, or queued by the client
   * itself): the caller's deadline runs from then, so time the app's own event loop spent before the
   * write is never counted against the store. A store that never calls it is timed from the end of the
   * event-loop turn in which `take()` was called. Later calls are ignored.
   */
  sent?: () => void;
}

/**
 * Where buckets live. The Redis store is shared by every instance; the memory store by one process. An
 * object of your own implementing this interface can be passed as the module's `store` option (README:
 * "A store of your own"); `nest-redis-rate-limit/testing` checks one against a reference model
 * (`verifyBucketStore`). The rules a store keeps, each of which the module relies on:
 *
 * 1. **One atomic decision per `take()`**: every bucket of `requests` is read, refilled
 *    (`tokens + elapsed ms * refillPerSecond / 1000`, never above `capacity`) and, for a take, drained by
 *    its `cost` only when every bucket has its cost and none is under a running penalty. Then all are
 *    drained, else none is touched: no other call may see or change a bucket between the read and the
 *    write. `requests` holds each key at most once. A missing (or unreadable) bucket is full.
 * 2. **Tokens are reported after the decision**, in request order: what each bucket holds once it was
 *    drained (allowed), or as it stands (refused; fractional, possibly negative under a penalty).
 * 3. **Refund** (`refund: true`) is always allowed and gives each bucket at or above 0 tokens (after the
 *    refill) its `cost` back, capped at `capacity`. A bucket below 0 has reservations waiting (rule 9) whose
 *    turns are set: it gets nothing back, unless the refund gives back a reservation (`givesBack`) and no
 *    reservation came after it (the bucket holds what that one left, plus the refill since, within half a
 *    token); then it gets the cost back.
 * 4. **Penalties**: a take refused while a bucket with `blockSeconds > 0` lacks its cost (and no penalty
 *    runs on it) starts one: the bucket's tokens drop to at most `penaltyCost - blockSeconds * refillPerSecond`
 *    (`penaltyCost` defaults to `cost`), so that the penalty's cost is back exactly `blockSeconds` from now,
 *    and the penalty's end (`now + blockSeconds * 1000`) is stored with the bucket. While it runs, every take
 *    of that bucket is refused, whatever the caller's numbers, and is told at most
 *    `cost - msLeft * refillPerSecond / 1000` tokens. A store may report the ms each penalty still runs as
 *    `penaltyMs` beside `tokens` (only in a call with a penalty); the deny cache then repeats a penalty's
 *    refusals without asking the store.
 * 5. **`dryRun` takes nothing**: the same answer as a take would get, and nothing written.
 * 6. **A bucket lives long enough**: it is kept (a TTL) at least until it would be full again, and until its
 *    penalty ends; a call never shortens the time a bucket is kept (another route sharing the name may need longer).
 * 7. **`delete()`** forgets buckets: the next take finds them full, with no penalty.
 * 8. **Remote stores** (`remote: true`) call `TakeOptions.sent` when a call is handed to their client; a call
 *    that fails rejects (never throws synchronously, never resolves with something else). The module then
 *    times each call out after `timeoutMs`, keeps a breaker per server (`nodeOf`), caches denials, and
 *    applies `failureMode` to a call that fails or times out. A local store (`remote: false`) is called
 *    directly, without a deadline or a deny cache; a call that rejects still follows `failureMode`.
 *
 * 9. **Reservations** (`reserve`, one bucket): the bucket is read and refilled as for a take; the answer's
 *    `waitMs` is the time until it holds its cost, `ceil((cost - tokens) / refillPerSecond * 1000)` (0 when
 *    it has it), and at least until a running penalty ends. When `waitMs <= reserve.maxWaitMs` the cost is
 *    taken (`allowed`; the tokens may go below 0) and the bucket keeps `w`, the largest `boundMs` seen, so that
 *    tokens down to `-(w * refillPerSecond / 1000 + 1)` count as reservations rather than damage (rule 1's
 *    repair); otherwise nothing is written. The Redis store also keeps that depth in tokens (`d`), which
 *    every caller reads alike whatever its refill. Giving a reservation back is a refund with `givesBack`
 *    (rule 3). A store without reservations answers without `waitMs`: `acquire()` then fails as on a store error.
 *
 * A reply that is not `{ allowed: boolean, tokens: number[] }` with one number per request counts as a
 * failed call. The module never calls lifecycle hooks (`onModuleDestroy`) of a store the application
 * passed in: the application closes it.
 */
export interface BucketStore {
  /** Drains all buckets or none, atomically (rules 1 to 5 above). */
  take(requests: readonly BucketRequest[], options?: TakeOptions): Promise<TakeResult>;
  /** Forgets buckets, so they start full. */
  delete(keys: readonly string[]): Promise<void>;
  /** True when decisions may fail or hang (a remote store), so they need a timeout. */
  readonly remote: boolean;
  /**
   * Whether the store can be asked now (the Redis store: its client is connected and ready), for the
   * health status. Absent: assumed reachable while its calls succeed.
   */
  reachable?(): boolean;
  /**
   * Drops a connection the store opened itself, at once: the application's start failed on one of the
   * module's checks, and Nest will not call `onModuleDestroy`. A client the application passed in is left alone.
   */
  abandon?(): void;
  /**
   * The server that holds `key`, for stores spread over several (a Redis Cluster: its master's
   * `host:port`; undefined while its slots are not known). Each gets its own breaker. Absent: one server.
   */
  nodeOf?(key: string): string | undefined;
}
export const BucketStore = Symbol('BucketStore');
