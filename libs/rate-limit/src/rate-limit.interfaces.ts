import type { ExecutionContext, Type } from '@nestjs/common';

/** The two numbers that define a token bucket. */
export interface BucketPolicy {
  /** Burst: how many tokens a full bucket holds (an integer >= 1). */
  capacity: number;
  /** Tokens added per second, fractional allowed (> 0). */
  refillPerSecond: number;
}

/** Where a route policy takes the identity whose bucket it drains. */
export type KeyBy = 'ip' | 'user' | 'apiKey' | ((context: ExecutionContext) => string | Promise<string>);

/**
 * When a route policy is decided. `'before-guards'`: in `RateLimitGuard`, before the app's own guards, so
 * it also counts requests they refuse (a per-IP login limit). `'after-guards'`: in `RateLimitInterceptor`,
 * after the app's guards, so it sees what they set (`req.user`).
 */
export type PolicyPhase = 'before-guards' | 'after-guards';

/** A policy number: fixed, or computed from each request (after the app's guards, by default). */
export type PolicyNumber = number | ((context: ExecutionContext) => number | Promise<number>);

/** The numbers a `RateLimitResolver` gives for one identity. */
export interface ResolvedLimits extends BucketPolicy {
  /** Tokens one request takes (default: the policy's `cost`, else 1). */
  cost?: number;
}

/** The identity whose bucket a policy drains, as a `RateLimitResolver` receives it. */
export interface RateLimitIdentity {
  /** Where it came from: a policy keyed by user or API key falls back to `'ip'` when the request has none. */
  kind: 'ip' | 'user' | 'apiKey' | 'custom';
  /** The user id, the (verified) API key, the address or what the keyBy function returned. */
  value: string;
}

/**
 * An injectable class that gives a policy its numbers per identity (say, from the tenant's plan):
 * `@RateLimit({ resolve: PlanLimits, keyBy: 'user' })`. It is instantiated by Nest with dependency
 * injection (it need not be a provider of any module). Answers are cached per identity for
 * `resolverCacheMs`.
 */
export interface RateLimitResolver {
  resolve(identity: RateLimitIdentity, context: ExecutionContext): ResolvedLimits | Promise<ResolvedLimits>;
}

/** Whether a request's outcome gives its tokens back: `'success'` (status < 400), `'failure'` (an error or status >= 400), or a function. */
export type RefundOn = 'success' | 'failure' | ((status: number, error: unknown) => boolean);

/**
 * A policy's leased mode (`lease`, docs/explanation/leases.md): this instance takes a batch of the
 * bucket's tokens in one call and spends them without a call per request.
 */
export interface LeaseOptions {
  /** How long a batch may be spent (ms, 50 to 10,000): tokens not spent by then are given back or lost. Default 500. */
  lifeMs?: number;
  /** The most tokens one batch holds (an integer >= 1). Default: a twentieth of the capacity (at least 1). */
  maxBatch?: number;
}

/** `true` (the defaults), `false` (exact: one call per decision) or the lease's numbers. */
export type LeaseOption = boolean | LeaseOptions;

/** A lease option checked and resolved: what the decision engine reads from a request. */
export interface LeaseSettings {
  lifeMs: number;
  /** Undefined: a twentieth of the capacity of the request's bucket (at least 1). */
  maxBatch: number | undefined;
}

/**
 * How deep into a bucket a request may go (docs/guides/priorities.md): `critical` may take its last
 * token, `default` and `sheddable` leave their share of the policy's `reserve`.
 */
export type PriorityLevel = 'critical' | 'default' | 'sheddable';

/**
 * A route policy's priority: one level for every request, or a function of the request (synchronous: an
 * answer that is not a level, a promise among them, or a throw counts as `'default'`, with a warning).
 */
export type PriorityOption = PriorityLevel | ((context: ExecutionContext) => PriorityLevel);

/**
 * The shares of the capacity kept from the lower levels: a number is the `sheddable` share; `default`
 * keeps 0 unless set. 0 <= default <= sheddable < 1; `critical` keeps none.
 */
export type ReserveOption = number | { sheddable?: number; default?: number };

/** What every route policy may set, besides its numbers. */
export interface RateLimitPolicyOptions {
  /** Whose bucket: `'ip'` (default), `'user'`, `'apiKey'` or a function of the execution context. */
  keyBy?: KeyBy;
  /** Tokens one request takes (default 1, at most `capacity`); a function computes it per request. */
  cost?: PolicyNumber;
  /** Bucket name shared by every route that uses it (default: `Controller.handler`). */
  name?: string;
  /**
   * When it is decided. Default: `'before-guards'` for `'ip'` and for `'apiKey'` read from the raw header,
   * when no number is a function; `'after-guards'` otherwise.
   */
  phase?: PolicyPhase;
  /** After the handler, give the tokens back when the outcome matches (a login limit that counts only failures: `'success'`). */
  refundOn?: RefundOn;
  /** A refusal makes the bucket wait at least this many seconds before it allows again (a penalty). */
  blockSeconds?: number;
  /** Skip this policy for a request when it answers true. Runs in the policy's phase. */
  skipIf?: (context: ExecutionContext) => boolean | Promise<boolean>;
  /** `false`: shadow mode. Decide and drain as usual, never refuse, report what would have been refused. Default: the module's `enforce`. */
  enforce?: boolean;
  /**
   * Leased mode for a hot bucket: this instance takes a batch of its tokens in one Redis call and spends
   * them without a call per request, never admitting more than the exact bucket would
   * (docs/explanation/leases.md). `true`, `false` or `{ lifeMs?, maxBatch? }`. Default: the module's `lease` (off).
   */
  lease?: LeaseOption;
  /**
   * The request's priority: `'critical'`, `'default'` or `'sheddable'`, or a function of the request
   * (docs/guides/priorities.md). Default `'default'`. Not with `lease`.
   */
  priority?: PriorityOption;
  /**
   * The shares of the capacity that `sheddable` (a number, or `{ sheddable, default }`) requests must leave
   * to the levels above them. Default, once `priority` is given: `{ sheddable: 0.2, default: 0 }`.
   */
  reserve?: ReserveOption;
}

/** One `@RateLimit()` policy on a controller or handler: fixed or per-request numbers, or a resolver. */
export type RateLimitPolicy = RateLimitPolicyOptions &
  (
    | {
        /** Burst: how many tokens a full bucket holds (an integer >= 1), or a function of the request. */
        capacity: PolicyNumber;
        /** Tokens added per second (> 0), or a function of the request. */
        refillPerSecond: PolicyNumber;
        resolve?: undefined;
      }
    | {
        /** A class that gives the numbers per identity. */
        resolve: Type<RateLimitResolver>;
        /** Used, with `refillPerSecond`, when the resolver fails or answers invalid numbers; else such a request is refused with 500. */
        capacity?: number;
        refillPerSecond?: number;
      }
  );

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

/** How a verdict was reached. */
export type VerdictSource =
  /** The configured store answered. */
  | 'store'
  /** Denied in process: the store denied this bucket recently and it cannot have refilled yet (`denyCache`). */
  | 'cache'
  /** The store failed; an in-process bucket decided (`failureMode: 'local'`). */
  | 'local'
  /** The store failed; allowed without a decision (`failureMode: 'open'`). */
  | 'open'
  /** The store failed; refused without a decision (`failureMode: 'closed'`). */
  | 'closed'
  /** Refused before any bucket: the identity or its address range is on the deny list (`RateLimitInsights.block()`). */
  | 'blocked';

/** One atomic decision over the buckets of a request. */
export interface Verdict {
  allowed: boolean;
  /** One decision per bucket, in request order. */
  decisions: BucketDecision[];
  source: VerdictSource;
}
