/**
 * The OpenTelemetry names this library records under, in the style of the semantic conventions:
 * dot-separated namespaces, snake_case words, UCUM units (`{decision}` is an annotation: a count of
 * decisions), durations in seconds. A Prometheus exporter turns dots into underscores and adds
 * `_total` to counters (`ratelimit_decisions_total`).
 */

/** The instrumentation scope (the meter's name). */
export const METER_NAME = 'nest-redis-rate-limit';

export const RateLimitMetricNames = {
  /** Counter, `{decision}`: one per policy decided. Attributes `ratelimit.scope`, `ratelimit.outcome`, `ratelimit.source`. */
  decisions: 'ratelimit.decisions',
  /** Counter, `{decision}`: allowed decisions that left less than 10% of the bucket's capacity. Attributes `ratelimit.scope`, `ratelimit.source`. */
  nearLimit: 'ratelimit.near_limit',
  /** Histogram, `s`: how long each store call took (timed-out ones included). Attribute `ratelimit.store.outcome`. */
  storeDuration: 'ratelimit.store.duration',
  /** Counter, `{decision}`: one per `@ConcurrencyLimit` slot asked for. Attributes `ratelimit.scope`, `ratelimit.outcome` (`allowed` or `denied`), `ratelimit.source`. */
  concurrencyDecisions: 'ratelimit.concurrency.decisions',
  /** Asynchronous gauge, `{slot}`: the concurrency slots this instance holds now (routes and `takeSlot()` alike). No attributes. */
  concurrencyHeld: 'ratelimit.concurrency.held',
  /** Asynchronous gauge: 1 while the store keeps failing (the breaker is open: one probe at a time), else 0. No attributes. */
  breakerOpen: 'ratelimit.store.breaker.open',
} as const;

export const RateLimitMetricAttributes = {
  /** The policy's bucket scope: its `name`, or `Controller.handler` (paths or version appended when classes share a name; one value per policy, never an identity). */
  scope: 'ratelimit.scope',
  /** `allowed`, `denied` or `shadow-denied`. */
  outcome: 'ratelimit.outcome',
  /** `store`, `cache`, `local`, `open` or `closed`. */
  source: 'ratelimit.source',
  /** `ok`, or `error` (the store failed or timed out). */
  storeOutcome: 'ratelimit.store.outcome',
} as const;

/** A decision is near the limit when it leaves fewer tokens than this share of the capacity. */
export const NEAR_LIMIT_SHARE = 0.1;

/** Bucket boundaries of the store-duration histogram, in seconds: a Redis round trip is well under a millisecond to `timeoutMs` (100 ms by default). */
export const STORE_DURATION_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5];
