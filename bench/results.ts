import type { ProbeStats } from './starved-probe.js';
import type { StarvedAppStats } from './starved-app.js';
import type { InstructionsResult } from './instructions-step.js';
import type { DecisionLimiter, HttpPath, HttpVariant, PromiseLimiter } from './settings.js';
import type { Spread, Verdict } from './stats.js';

/** The shape of `bench/results/<date>.json`; chart.ts and report.ts render only from this. */
export interface BenchResults {
  schema: 2;
  date: string;
  startedAt: string;
  durationSeconds: number;
  machine: {
    cpu: string;
    cores: number;
    memoryGb: number;
    os: string;
    node: string;
    redis: string;
    /** 'own': a redis-server the run started for itself; 'external': BENCH_REDIS_URL. */
    redisServer: 'own' | 'external';
    loadAverageAtStart: number[];
    loadAverageAtEnd: number[];
    note: string;
  };
  settings: Record<string, number>;
  limits: Record<string, Record<string, number>>;
  /** What each limiter keeps in Redis and how it decides. */
  algorithms: Partial<Record<HttpVariant | DecisionLimiter, string>>;
  method: Record<string, string>;
  http: {
    runs: HttpRun[];
    summary: Record<HttpPath, Partial<Record<HttpVariant, HttpSummary>>>;
  };
  decisions: {
    runs: DecisionRun[];
    summary: Partial<Record<DecisionLimiter, DecisionSummary>>;
    /** BENCH_BASELINE: the limiter `ours@<sha>` and the commit or package it was built from. */
    baseline?: { limiter: DecisionLimiter; side: string };
  };
  promise: Partial<Record<PromiseLimiter, PromiseResult>>;
  /** The instructions step (callgrind), when the run had it; also written to <date>-instructions.json. */
  instructions?: InstructionsResult;
  /** The starved step, when the run had it (BENCH_ONLY=...,starved); also written to <date>-starved.json. */
  starved?: StarvedResult;
  targets: Target[];
}

export interface HttpRun {
  round: number;
  path: HttpPath;
  variant: HttpVariant;
  requestsPerSecond: number;
  /** Latency of every answered request (autocannon's per-response time, µs resolution). */
  p50Ms: number;
  p99Ms: number;
  status2xx: number;
  statusNon2xx: number;
  errors: number;
  /** CPU time of the app process per answered request (Linux /proc; NaN elsewhere). */
  appCpuUsPerRequest: number;
  /** Redis main-thread CPU per answered request (INFO cpu). */
  redisCpuUsPerRequest: number;
  /**
   * Time Redis spent running commands per answered request (INFO commandstats, all commands but INFO):
   * steadier than INFO cpu on a busy machine, as it leaves out the event loop and the sockets.
   */
  redisCommandUsPerRequest: number;
  /** The same for the commands that are not scripts (EVALSHA, EVAL...): a limiter's other traffic, such as the operations flush. */
  redisOtherCommandUsPerRequest: number;
  /** requests/s over the same round's "no limiter" requests/s. */
  ratio: number;
  /** requests/s over the same round's floor (minimal guard / throw-only guard) requests/s. */
  ratioToFloor: number;
  /** p99 minus the same round's "no limiter" p99, ms. */
  p99AddedMs: number;
}

/** Every figure: median over rounds and the per-round spread. */
export interface HttpSummary {
  requestsPerSecond: Spread;
  p50Ms: Spread;
  p99Ms: Spread;
  p99AddedMs: Spread;
  ratio: Spread;
  ratioToFloor: Spread;
  /** Share of responses that were 2xx over all rounds (allowed path: 1; denied path: near 0). */
  share2xx: number;
  appCpuUsPerRequest: Spread;
  redisCpuUsPerRequest: Spread;
  redisCommandUsPerRequest: Spread;
  redisOtherCommandUsPerRequest: Spread;
}

export interface DecisionRun {
  round: number;
  limiter: DecisionLimiter;
  decisionsPerSecond: number;
  errors: number;
  /** Redis main-thread CPU (INFO cpu) per decision, µs. */
  redisCpuUsPerDecision: number;
  /** 1e6 / redisCpuUsPerDecision: decisions one fully busy Redis core could make per second. */
  decisionsPerCpuSecond: number;
  /** Script command(s) the limiter sent (INFO commandstats), e.g. `evalsha`. */
  scriptCommand: string;
  /** usec_per_call of those commands over the measured part. */
  scriptUsecPerCall: number;
  /** Script calls per decision (below 1 when one call decides several buckets). */
  scriptCallsPerDecision: number;
  /** Script µs per decision (usec_per_call × calls / decisions). */
  scriptUsecPerDecision: number;
  /** decisions/s over the same round's reference script decisions/s. */
  ratioToReference: number;
  /** One call at a time: latency of a lone decision, µs. */
  loneP50Us: number;
  loneP99Us: number;
}

export interface DecisionSummary {
  decisionsPerSecond: Spread;
  ratioToReference: Spread;
  redisCpuUsPerDecision: Spread;
  decisionsPerCpuSecond: Spread;
  scriptCommand: string;
  scriptUsecPerCall: Spread;
  scriptCallsPerDecision: Spread;
  scriptUsecPerDecision: Spread;
  loneP50Us: Spread;
  loneP99Us: Spread;
  /** MEMORY USAGE per idle bucket (one measurement; deterministic for a given Redis build). */
  bytesPerIdleBucket: number;
  keysPerIdleBucket: number;
}

/** A count checked against a bound: never more than `bound`. */
export interface BoundCheck {
  what: string;
  measured: number;
  bound: number;
  ok: boolean;
}

export interface PromiseResult {
  /** What the limiter's documentation promises, in its own terms. */
  semantics: 'token bucket' | 'fixed window';
  promise: string;
  saturation: { seconds: number; allowed: number; denied: number; errors: number };
  /** The promise judged by its own semantics. */
  own: { checks: BoundCheck[]; kept: boolean };
  /** What a user who reads "100 per second" gets: the most allowed in any sliding span. */
  reader: { statedPerSecond: number; saturatedMaxIn1s: number; boundaryMaxIn1s: number; boundaryMaxIn200ms: number };
}

export interface Target {
  /** The issue 11 item it comes from. */
  item: string;
  name: string;
  goal: string;
  /** The figure judged: median (min–max over rounds), in the goal's terms. */
  figure: Spread;
  unit: string;
  /** Other figures behind it (e.g. the peers' medians). */
  detail: string;
  verdict: Verdict;
}

/** One phase of the starved step: the app's decisions next to Redis' latency seen by the probe. */
export interface StarvedRun {
  round: number;
  /** 'quiet': nothing else running; 'cpu': `hogs` CPU-bound processes beside the app and Redis. */
  load: 'quiet' | 'cpu';
  hogs: number;
  seconds: number;
  /** The load generator's view (autocannon in the bench process). */
  client: {
    requests: number;
    requestsPerSecond: number;
    status2xx: number;
    status429: number;
    otherStatus: number;
    errors: number;
    p50Ms: number;
    p99Ms: number;
  };
  /** What each identity may get in the phase: capacity + refill·t, floored. */
  boundPerIdentity: number;
  /** The app's onDecision counts and its own event-loop delay. */
  app: StarvedAppStats;
  /** The separate probe: PING latency from a process of its own, over the same phase. */
  redis: ProbeStats & {
    /** Redis main-thread CPU over the phase, % of one core (INFO cpu). */
    cpuPercent: number;
    /** Script calls (EVALSHA) over the phase and their mean cost inside Redis (INFO commandstats). */
    scriptCalls: number;
    scriptUsecPerCall: number;
  };
  /** Decisions that fell to failureMode (source not 'store' or 'cache'): sent to Redis and timed out, or not sent (breaker open). */
  failedDecisions: number;
  /**
   * Store calls that failed (each a decision that asked Redis and had no answer within timeoutMs of its
   * write), judged by the probe over the decision's wait (from asked for to failed): `probeLate`, a PING
   * of the probe in flight then took > 100 ms; `probePrompt`, the probe had a PING in flight at every moment
   * of the wait (no gap over two periods) and each was answered within 100 ms; `probeBlind`, otherwise
   * (the probe itself did not run for part of the wait).
   */
  timedOut: { total: number; probeLate: number; probePrompt: number; probeBlind: number };
  /** 1-minute load average at the end of the phase. */
  loadAverage: number;
}

export interface StarvedResult {
  date: string;
  /** The library's commit (git HEAD) and whether libs/ had changes not committed: a before-fix run says so. */
  code: string;
  settings: Record<string, number>;
  method: string;
  runs: StarvedRun[];
  /** Sums and extremes per load over the rounds. */
  summary: Record<'quiet' | 'cpu', StarvedSummary>;
}

export interface StarvedSummary {
  rounds: number;
  requests: number;
  admitted: number;
  admittedWithoutDecision: number;
  admittedBeyondPromise: number;
  failedDecisions: number;
  timedOut: { total: number; probeLate: number; probePrompt: number; probeBlind: number };
  identities: number;
  identitiesOverPromise: number;
  decisionsBySource: Record<string, number>;
  /** Per-round medians and the worst round of the probe. */
  redisP50Ms: Spread;
  redisP99Ms: Spread;
  redisMaxMs: number;
  redisOver100Ms: number;
  probes: number;
  appLoopDelayMaxMs: number;
}
