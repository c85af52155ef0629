import type { BucketRequest } from './token-bucket.js';

/** The outcome of one atomic decision over one or more buckets. */
export interface TakeResult {
  /** True when every bucket had its cost and all were drained; false when none was touched. */
  allowed: boolean;
  /** Tokens each bucket holds afterwards, in request order (fractional). */
  tokens: number[];
}

export interface TakeOptions {
  /** Compute without taking anything (peek). */
  dryRun?: boolean;
  /** Give each bucket its cost back (capped at capacity), e.g. a take that a later refusal undoes. Always allowed. */
  refund?: boolean;
  /** Clock override in ms, for deterministic tests only. Default: the store's clock (Redis TIME). */
  now?: number;
  /**
   * A remote store calls this when the call is handed to its client (written, or queued by the client
   * itself): the caller's deadline runs from then, so time the app's own event loop spent before the
   * write is never counted against the store.
   */
  sent?: () => void;
}

/** Where buckets live. The Redis store is shared by every instance; the memory store by one process. */
export interface BucketStore {
  /** Drains all buckets or none, atomically. */
  take(requests: readonly BucketRequest[], options?: TakeOptions): Promise<TakeResult>;
  /** Forgets buckets, so they start full. */
  delete(keys: readonly string[]): Promise<void>;
  /** True when decisions may fail or hang (a remote store), so they need a timeout. */
  readonly remote: boolean;
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
