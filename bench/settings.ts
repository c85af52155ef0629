/**
 * What the benchmark measures and for how long. Every duration and count can be changed with an
 * environment variable (with the defaults a full run takes about ten minutes).
 */

function numberFromEnv(name: string, fallback: number): number {
  const raw = process.env[name];
  if (raw === undefined || raw === '') return fallback;
  const value = Number(raw);
  if (!Number.isFinite(value) || value < 0) throw new Error(`${name} must be a number >= 0 (got "${raw}")`);
  return value;
}

/**
 * The Redis every process of the run talks to. run.js starts a redis-server of its own (so that INFO
 * cpu and INFO commandstats count only the bench) and hands its URL to every child process in
 * BENCH_REDIS_URL; set BENCH_REDIS_URL yourself to use an existing server instead. Read when called:
 * run.js sets the variable after it has started its server.
 */
export function benchRedisUrl(): string {
  return process.env.BENCH_REDIS_URL ?? 'redis://127.0.0.1:6379';
}

export const SETTINGS = {
  /** HTTP: rounds over which the variants are interleaved. */
  httpRounds: numberFromEnv('BENCH_ROUNDS', 5),
  /** HTTP: seconds of load measured per variant and round. */
  httpSeconds: numberFromEnv('BENCH_SECONDS', 6),
  /** HTTP: seconds of load thrown away before each measurement. */
  httpWarmupSeconds: numberFromEnv('BENCH_WARMUP_SECONDS', 1.5),
  /** HTTP: autocannon connections. */
  connections: numberFromEnv('BENCH_CONNECTIONS', 50),
  /** Decisions/s: rounds over which the limiters are interleaved. */
  decisionRounds: numberFromEnv('BENCH_DECISION_ROUNDS', 5),
  /** Decisions/s: seconds measured per limiter and round (after a warm-up). */
  decisionSeconds: numberFromEnv('BENCH_DECISION_SECONDS', 3),
  /** Decisions/s: seconds of warm-up before each measurement. */
  decisionWarmupSeconds: numberFromEnv('BENCH_DECISION_WARMUP_SECONDS', 1),
  /** Decisions/s: calls in flight. */
  inFlight: numberFromEnv('BENCH_IN_FLIGHT', 64),
  /** Decisions/s: distinct keys the calls cycle through. */
  decisionKeys: numberFromEnv('BENCH_DECISION_KEYS', 10_000),
  /** Latency: seconds of one call at a time per limiter and round (p50 / p99 of a lone call). */
  latencySeconds: numberFromEnv('BENCH_LATENCY_SECONDS', 1),
  /** Memory: idle buckets created per limiter for MEMORY USAGE. */
  memoryBuckets: numberFromEnv('BENCH_MEMORY_BUCKETS', 1_000),
  /** Promise: processes hammering one key. */
  promiseProcesses: numberFromEnv('BENCH_PROMISE_PROCESSES', 4),
  /** Promise: calls in flight per process. */
  promiseInFlight: numberFromEnv('BENCH_PROMISE_IN_FLIGHT', 32),
  /** Promise: seconds of saturation per limiter. */
  promiseSeconds: numberFromEnv('BENCH_PROMISE_SECONDS', 6),
};

/**
 * The instructions step (bench/instructions-step.ts): requests per app process under callgrind.
 * Under valgrind a request takes 3-30 ms. Even after 6,000 warm-up requests the first N requests of a
 * path still pay for the JIT (I(N) / N is 5-16 % above (I(2N) − I(N)) / N); that part cancels.
 */
export const INSTRUCTIONS = {
  /** Requests before anything is counted, alternating over the app's measured paths. */
  warmup: numberFromEnv('BENCH_INSTR_WARMUP', 6_000),
  /** N: the segments are N and 2N requests; per request = (I(2N) − I(N)) / N. */
  n: numberFromEnv('BENCH_INSTR_N', 1_000),
  /** Processes per app (the spread is taken over them). */
  repeats: numberFromEnv('BENCH_INSTR_REPEATS', 2),
  /** Apps under valgrind at the same time (instruction counts do not depend on CPU contention). */
  parallel: numberFromEnv('BENCH_INSTR_PARALLEL', 2),
};

/**
 * The limits, each written in every limiter's own idiom. "Allowed": a limit nobody reaches. "Denied":
 * 10 per second, which the load exceeds several hundred times over. "Promise": 100 per second, with a
 * burst of 100 for the token bucket.
 */
export const LIMITS = {
  allowed: { capacity: 1_000_000_000, refillPerSecond: 1_000_000_000, limit: 1_000_000_000, windowMs: 60_000 },
  denied: { capacity: 10, refillPerSecond: 10, limit: 10, windowMs: 1_000 },
  /** The instructions step's /denied: one token per 10,000 s, so a slow app (under valgrind) never sees one refill. */
  deniedNoRefill: { capacity: 10, refillPerSecond: 0.0001, limit: 10, windowMs: 100_000_000 },
  promise: { capacity: 100, refillPerSecond: 100, limit: 100, windowMs: 1_000 },
  /** Idle buckets for MEMORY USAGE: slow enough that none expires before it is measured. */
  memory: { capacity: 100, refillPerSecond: 1, limit: 100, windowMs: 60_000 },
} as const;

/** What a reader of the promise limits takes them to mean: "100 per second". */
export const STATED_PER_SECOND = 100;

/** Boundary probe: after the request that opens a window, saturation starts this late and lasts this long. */
export const PROBE_OPEN_MS = 900;
export const PROBE_LENGTH_MS = 1_000;

export type Limits = (typeof LIMITS)[keyof typeof LIMITS];

/**
 * HTTP variants: the same Nest Express app with one JSON route behind each limiter.
 * - `minimal-guard`: the allowed-path floor, one EVALSHA of the reference script and the same headers as ours;
 * - `throw-only`: the denied-path floor, a guard that throws a 429 and touches no Redis (Nest's own cost of a refusal).
 * - `throw-later`: the same guard, refusing one event-loop turn later (after `setImmediate`), as a refusal that
 *   waited for a Redis reply does: what answering in a later turn is worth on this machine (not a floor).
 */
export const HTTP_VARIANTS = [
  'none',
  'ours',
  'minimal-guard',
  'throw-only',
  'throw-later',
  'nestjs-throttler',
  'rate-limiter-flexible',
  'ours-no-deny-cache',
  'ours-operations',
] as const;
export type HttpVariant = (typeof HTTP_VARIANTS)[number];
/** `ours-no-deny-cache` differs from `ours` only on the denied path; `ours-operations` (analytics on) is measured on the allowed path. */
const ALL_HTTP_PATHS = {
  allowed: ['none', 'ours', 'minimal-guard', 'nestjs-throttler', 'rate-limiter-flexible', 'ours-operations'],
  denied: ['none', 'ours', 'throw-only', 'throw-later', 'nestjs-throttler', 'rate-limiter-flexible', 'ours-no-deny-cache'],
} as const satisfies Record<string, readonly HttpVariant[]>;
export type HttpPath = keyof typeof ALL_HTTP_PATHS;
/** The floor each path's target is measured against. */
export const HTTP_FLOORS: Record<HttpPath, HttpVariant> = { allowed: 'minimal-guard', denied: 'throw-only' };
/** The other libraries (peers) ours is compared with. */
export const HTTP_PEERS = ['nestjs-throttler', 'rate-limiter-flexible'] as const satisfies readonly HttpVariant[];
/** BENCH_VARIANTS=ours,minimal-guard keeps only those variants ("none" is always kept: ratios need it). */
const KEEP = process.env.BENCH_VARIANTS ? new Set(['none', ...process.env.BENCH_VARIANTS.split(',')]) : undefined;
export const HTTP_PATHS: Record<HttpPath, readonly HttpVariant[]> = {
  allowed: ALL_HTTP_PATHS.allowed.filter((v) => !KEEP || KEEP.has(v)),
  denied: ALL_HTTP_PATHS.denied.filter((v) => !KEEP || KEEP.has(v)),
};

/** Limiters measured without HTTP (decisions/s, Redis cost, latency, memory). */
export const LIMITERS = ['ours', 'ours-no-coalesce', 'reference', 'rate-limiter-flexible', 'nestjs-throttler'] as const;
export type LimiterName = (typeof LIMITERS)[number];
/** The floor of the decisions table: the cheapest correct script through a plain client. */
export const DECISION_FLOOR: LimiterName = 'reference';
/**
 * BENCH_BASELINE=<commit, branch or built package dir>: the decisions step also measures `ours@<sha>`,
 * ours created exactly as `ours` is but from that build of the library (bench/library-builds.ts builds a
 * commit's in .bench-tmp/trees/<sha>/), in a worker of its own, rotated with the others in every round.
 */
export const BASELINE = process.env.BENCH_BASELINE || undefined;
/** A limiter of the decisions step: one of LIMITERS, or ours from the baseline's library (`ours@<label>`). */
export type DecisionLimiter = LimiterName | `ours@${string}`;
/**
 * The decisions step's limiters of LIMITERS: BENCH_VARIANTS keeps only those it names, and the reference
 * script (the floor: every ratio of the step needs it). The baseline (BENCH_BASELINE) is added beside
 * them whatever BENCH_VARIANTS says.
 */
export const DECISION_LIMITERS: readonly LimiterName[] = LIMITERS.filter((l) => !KEEP || KEEP.has(l) || l === DECISION_FLOOR);

/** A decision limiter's label: LABELS / SHORT_LABELS, or for the baseline its library's commit. */
export function limiterLabel(name: DecisionLimiter, short = false): string {
  if (name.startsWith('ours@')) return short ? name : `ours (nest-redis-rate-limit) built from ${name.slice(5)} (BENCH_BASELINE)`;
  return (short ? SHORT_LABELS : LABELS)[name as LimiterName];
}
/** The other libraries (peers) ours is compared with. */
export const DECISION_PEERS = ['rate-limiter-flexible', 'nestjs-throttler'] as const satisfies readonly LimiterName[];
/** Limiters whose promise is checked (the reference script is not a library). */
export const PROMISE_LIMITERS = ['ours', 'rate-limiter-flexible', 'nestjs-throttler'] as const satisfies readonly LimiterName[];
export type PromiseLimiter = (typeof PROMISE_LIMITERS)[number];

export const LABELS: Record<HttpVariant | LimiterName, string> = {
  none: 'no limiter',
  ours: 'ours (nest-redis-rate-limit)',
  'ours-no-deny-cache': 'ours, denyCache: false',
  'ours-operations': 'ours, operations: true (analytics on)',
  'ours-no-coalesce': 'ours, coalesce: false',
  'minimal-guard': 'floor: minimal guard (one EVALSHA of the reference script, same headers as ours)',
  'throw-only': 'floor: a guard that only throws a 429 (no Redis)',
  'throw-later': 'the same guard, throwing one event-loop turn later (setImmediate)',
  'nestjs-throttler': '@nestjs/throttler + @nest-lab/throttler-storage-redis',
  'rate-limiter-flexible': 'rate-limiter-flexible RateLimiterRedis',
  reference: 'floor: reference token-bucket script (EVALSHA, plain ioredis client)',
};

/** Short names, for the chart's narrow label column and the console. */
export const SHORT_LABELS: Record<HttpVariant | LimiterName, string> = {
  none: 'no limiter',
  ours: 'ours',
  'ours-no-deny-cache': 'ours, denyCache: false',
  'ours-operations': 'ours, operations on',
  'ours-no-coalesce': 'ours, coalesce: false',
  'minimal-guard': 'floor: minimal guard',
  'throw-only': 'floor: throw-only guard',
  'throw-later': 'throw-only, a turn later',
  'nestjs-throttler': '@nestjs/throttler (redis)',
  'rate-limiter-flexible': 'rate-limiter-flexible',
  reference: 'floor: reference script',
};

/**
 * The starved step (BENCH_ONLY=starved; not part of the default run): our app with default options
 * beside `hogs` CPU-bound processes, measured in `rounds` rounds of one quiet and one loaded phase of
 * `seconds` each. The route's bucket: `capacity` tokens, `refillPerSecond` (one token per 1000 s, so a
 * client's promise over a phase is `capacity`). Each client identity (an X-Forwarded-For address) gets
 * `perIdentity` consecutive requests of the load, spread over the connections, so they arrive together.
 */
export const STARVED = {
  rounds: numberFromEnv('BENCH_STARVED_ROUNDS', 3),
  seconds: numberFromEnv('BENCH_STARVED_SECONDS', 15),
  hogs: numberFromEnv('BENCH_STARVED_HOGS', 16),
  connections: numberFromEnv('BENCH_STARVED_CONNECTIONS', 64),
  perIdentity: numberFromEnv('BENCH_STARVED_PER_IDENTITY', 20),
  /** The separate probe's period: one PING every this many ms. */
  probeEveryMs: numberFromEnv('BENCH_STARVED_PROBE_MS', 10),
  capacity: 5,
  refillPerSecond: 0.001,
  /** The library's default timeoutMs: what a probe reply later than this would have cost a decision. */
  defaultTimeoutMs: 100,
};

/**
 * The acquire step (issue 23): `processes` processes all wanting as many grants as they can from one
 * bucket (B = capacity, R = refillPerSecond), `inFlight` waiting callers each, for `seconds`; ours
 * (BucketService.acquire()) and rate-limiter-flexible's RateLimiterQueue over RateLimiterRedis (R
 * points per 1 s window) one after the other. Not in the default run: BENCH_ONLY=acquire.
 */
export const ACQUIRE = {
  processes: numberFromEnv('BENCH_ACQUIRE_PROCESSES', 4),
  inFlight: numberFromEnv('BENCH_ACQUIRE_IN_FLIGHT', 32),
  seconds: numberFromEnv('BENCH_ACQUIRE_SECONDS', 5),
  capacity: numberFromEnv('BENCH_ACQUIRE_CAPACITY', 10),
  refillPerSecond: numberFromEnv('BENCH_ACQUIRE_REFILL', 200),
};

/**
 * The failure-mode step (issue 32, item 6): the default failureMode ('local') beside an explicit
 * 'open', with a healthy Redis and with none listening. `rounds` interleaved rounds, `seconds` of
 * load measured per app and phase after `warmupSeconds`; /limited's bucket per API key: `capacity`
 * tokens, `refillPerSecond`. Not in the default run: BENCH_ONLY=failure-mode.
 */
export const FAILURE_MODE = {
  rounds: numberFromEnv('BENCH_FAILURE_MODE_ROUNDS', 5),
  seconds: numberFromEnv('BENCH_FAILURE_MODE_SECONDS', 4),
  warmupSeconds: numberFromEnv('BENCH_FAILURE_MODE_WARMUP_SECONDS', 1),
  capacity: 10,
  refillPerSecond: 1,
};

/**
 * The leases step (issue 35, item 3): one hot key, `processes` app processes (leases-app.ts: one route
 * per variant, every request from 127.0.0.1, so one bucket per route for all the processes; capacity and
 * refill 1e9 so that every decision is allowed and the figures are the cost of deciding). Per variant and round:
 * `warmupSeconds`, then `seconds` saturated (`connections` autocannon connections per process), then
 * `rateWarmupSeconds` and `rateSeconds` at a fixed `rate` of requests per second over all processes
 * (the latency figures). In the default run with one round; BENCH_ONLY=leases runs it alone.
 */
export const LEASES = {
  rounds: numberFromEnv('BENCH_LEASES_ROUNDS', 1),
  processes: numberFromEnv('BENCH_LEASES_PROCESSES', 4),
  connections: numberFromEnv('BENCH_LEASES_CONNECTIONS', 16),
  warmupSeconds: numberFromEnv('BENCH_LEASES_WARMUP_SECONDS', 1),
  seconds: numberFromEnv('BENCH_LEASES_SECONDS', 4),
  rate: numberFromEnv('BENCH_LEASES_RATE', 1_000),
  rateWarmupSeconds: numberFromEnv('BENCH_LEASES_RATE_WARMUP_SECONDS', 0.5),
  rateSeconds: numberFromEnv('BENCH_LEASES_RATE_SECONDS', 3),
};

/**
 * The concurrency step (issue 36, item 4; concurrency-step.ts): one app process per variant (concurrency-app.ts:
 * GET /work with no limiter, `@RateLimit`, `@ConcurrencyLimit(limit)` or the floor's sorted set), `rounds`
 * rounds in rotated order, each `warmupSeconds` then `seconds` measured with SETTINGS.connections
 * autocannon connections; `limit` is above the connections, so no request is refused (the cost of
 * deciding). Then redis-server under callgrind: `n` calls of each operation, one at a time, per segment,
 * `segments` segments each (BENCH_CONCURRENCY_CALLGRIND=0 leaves that part out).
 */
export const CONCURRENCY = {
  rounds: numberFromEnv('BENCH_CONCURRENCY_ROUNDS', 3),
  seconds: numberFromEnv('BENCH_CONCURRENCY_SECONDS', 5),
  warmupSeconds: numberFromEnv('BENCH_CONCURRENCY_WARMUP_SECONDS', 1),
  limit: numberFromEnv('BENCH_CONCURRENCY_LIMIT', 1_000),
  callgrind: numberFromEnv('BENCH_CONCURRENCY_CALLGRIND', 1),
  n: numberFromEnv('BENCH_CONCURRENCY_N', 1_000),
  segments: numberFromEnv('BENCH_CONCURRENCY_SEGMENTS', 3),
  warmup: numberFromEnv('BENCH_CONCURRENCY_WARMUP', 2_000),
  /** Other holders in the slots' hash during the "busy" callgrind segments (about the HTTP phase's in flight). */
  others: numberFromEnv('BENCH_CONCURRENCY_OTHERS', 49),
};
