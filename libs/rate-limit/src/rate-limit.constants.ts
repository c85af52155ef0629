/** Metadata key under which `@RateLimit()` stores its policies (an array, outermost decorator first). */
export const RATE_LIMIT_POLICIES = 'RATE_LIMIT:POLICIES';
/** Metadata key set by `@SkipRateLimit()`. */
export const RATE_LIMIT_SKIP = 'RATE_LIMIT:SKIP';
/** `@ConcurrencyLimit` metadata: the route's (or class's) concurrency limit. */
export const RATE_LIMIT_CONCURRENCY = 'RATE_LIMIT:CONCURRENCY';
/** Static property naming what a class of this library is (`'guard'` or `'interceptor'`), also on subclasses. */
export const RATE_LIMIT_ENHANCER = Symbol('RATE_LIMIT:ENHANCER');
/**
 * Injection token (internal): true when the module's global guard is not a `RateLimitGuard` although
 * `guard` is on, i.e. a test replaced it (`overrideGuard(RateLimitGuard).useValue(...)` in @nestjs/testing).
 */
export const RATE_LIMIT_GUARD_REPLACED = Symbol('RATE_LIMIT:GUARD_REPLACED');
/** Property of the request object where the guard leaves its verdict (`RateLimitState`) for code that runs after it. */
export const RATE_LIMIT_VERDICT = Symbol('RATE_LIMIT:VERDICT');

export const DEFAULT_KEY_PREFIX = 'rl:';
export const DEFAULT_TIMEOUT_MS = 100;
/** The default of `acquire.maxWaitMs`: the longest wait of `BucketService.acquire()` and `@Paced`. */
export const DEFAULT_ACQUIRE_MAX_WAIT_MS = 60_000;
/** The default of `acquire.maxWaiting`: calls of `acquire()` waiting at once in one process. */
export const DEFAULT_ACQUIRE_MAX_WAITING = 10_000;
/** How long a `RateLimitResolver`'s answer for one identity is reused, in ms. */
export const DEFAULT_RESOLVER_CACHE_MS = 1_000;
/** Identities whose resolved limits one instance remembers at most. */
export const RESOLVER_CACHE_MAX_ENTRIES = 10_000;
export const DEFAULT_API_KEY_HEADER = 'x-api-key';
/** How often a degraded store logs a warning while decisions keep failing. */
export const FAILURE_LOG_INTERVAL_MS = 10_000;
/** Buckets the deny cache of one instance remembers at most (about 100 bytes each). */
export const DENY_CACHE_MAX_ENTRIES = 10_000;
/** How long start-up waits for a Redis connection the module created before going on without it. */
export const CONNECT_WAIT_MS = 1_000;
/** Store failures in a row after which only one decision at a time waits for the store (the probe). */
export const PROBE_AFTER_FAILURES = 3;

/** Identities and names made only of these characters (and not longer than the bound) appear in key names as they are. */
export const SAFE_IDENTITY = /^[A-Za-z0-9._:@-]{1,64}$/;
/** Hex digits of the SHA-256 digest kept when an identity or API key is hashed. */
export const DIGEST_LENGTH = 32;

export const HEADERS = {
  legacyLimit: 'X-RateLimit-Limit',
  legacyRemaining: 'X-RateLimit-Remaining',
  legacyReset: 'X-RateLimit-Reset',
  limit: 'RateLimit-Limit',
  remaining: 'RateLimit-Remaining',
  reset: 'RateLimit-Reset',
  policy: 'RateLimit-Policy',
  combined: 'RateLimit',
  retryAfter: 'Retry-After',
  concurrencyLimit: 'Concurrency-Limit',
  concurrencyInFlight: 'Concurrency-In-Flight',
} as const;
