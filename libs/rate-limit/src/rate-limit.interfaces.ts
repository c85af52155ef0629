import type { ExecutionContext } from '@nestjs/common';

/** The two numbers that define a token bucket. */
export interface BucketPolicy {
  /** Burst: how many tokens a full bucket holds (an integer >= 1). */
  capacity: number;
  /** Tokens added per second, fractional allowed (> 0). */
  refillPerSecond: number;
}

/** Where a route policy takes the identity whose bucket it drains. */
export type KeyBy =
  | 'ip'
  | 'user'
  | 'apiKey'
  | ((context: ExecutionContext) => string | Promise<string>);

/**
 * When a route policy is decided. `'before-guards'`: in `RateLimitGuard`, before the app's own guards, so
 * it also counts requests they refuse (a per-IP login limit). `'after-guards'`: in `RateLimitInterceptor`,
 * after the app's guards, so it sees what they set (`req.user`).
 */
export type PolicyPhase = 'before-guards' | 'after-guards';

/** One `@RateLimit()` policy on a controller or handler. */
export interface RateLimitPolicy extends BucketPolicy {
  /** Whose bucket: `'ip'` (default), `'user'`, `'apiKey'` or a function of the execution context. */
  keyBy?: KeyBy;
  /** Tokens one request takes (default 1, at most `capacity`). */
  cost?: number;
  /** Bucket name shared by every route that uses it (default: `Controller.handler`). */
  name?: string;
  /**
   * When it is decided. Default: `'before-guards'` for `'ip'` and for `'apiKey'` read from the raw header;
   * `'after-guards'` for `'user'`, for `'apiKey'` with `keys.apiKey` set, and for keyBy functions.
   */
  phase?: PolicyPhase;
}

/** What one bucket said about one request. All counts are integers. */
export interface BucketDecision {
  /** Whether the tokens were taken. */
  allowed: boolean;
  /** The bucket's capacity. */
  limit: number;
  /** Whole tokens left after this decision. */
  remaining: number;
  /** Seconds until a denied request of the same cost can succeed; 0 when allowed. */
  retryAfterSeconds: number;
  /** Seconds until the bucket is full again. */
  resetSeconds: number;
}
