import type { HttpPath, HttpVariant, LimiterName } from './settings.js';

/** The shape of `bench/results/<date>.json`; chart.ts and report.ts render only from this. */
export interface BenchResults {
  schema: 1;
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
    loadAverageAtStart: number[];
    loadAverageAtEnd: number[];
    note: string;
  };
  settings: Record<string, number>;
  limits: Record<string, Record<string, number>>;
  /** What each limiter keeps in Redis and how it decides. */
  algorithms: Record<LimiterName, string>;
  method: Record<'http' | 'decisions' | 'memory' | 'promise' | 'denyCache', string>;
  http: {
    runs: HttpRun[];
    summary: Record<HttpPath, Partial<Record<HttpVariant, HttpSummary>>>;
  };
  decisions: {
    runs: DecisionRun[];
    summary: Partial<Record<LimiterName, DecisionSummary>>;
  };
  promise: Partial<Record<LimiterName, PromiseResult>>;
  targets: Target[];
}

export interface HttpRun {
  round: number;
  path: HttpPath;
  variant: HttpVariant;
  requestsPerSecond: number;
  p50Ms: number;
  p99Ms: number;
  status2xx: number;
  statusNon2xx: number;
  errors: number;
  /** CPU time of the app process per answered request (Linux /proc; NaN elsewhere). */
  appCpuUsPerRequest: number;
  /** Redis main-thread CPU per answered request (INFO cpu; includes whatever else the server did). */
  redisCpuUsPerRequest: number;
  /** requests/s over the same round's "no limiter" requests/s. */
  ratio: number;
}

export interface HttpSummary {
  requestsPerSecond: number;
  p50Ms: number;
  p99Ms: number;
  /** Median over rounds of the per-round ratio to "no limiter". */
  ratio: number;
  /** Share of responses that were 2xx (allowed path: 1; denied path: near 0). */
  share2xx: number;
  appCpuUsPerRequest: number;
  redisCpuUsPerRequest: number;
}

export interface DecisionRun {
  round: number;
  limiter: LimiterName;
  decisionsPerSecond: number;
  errors: number;
  redisCpuUsPerDecision: number;
  /** decisions/s over the same round's bare EVALSHA decisions/s. */
  ratioToFloor: number;
}

export interface DecisionSummary {
  decisionsPerSecond: number;
  ratioToFloor: number;
  redisCpuUsPerDecision: number;
  bytesPerIdleBucket: number;
  keysPerIdleBucket: number;
}

export interface PromiseResult {
  promise: string;
  saturation: {
    seconds: number;
    allowed: number;
    /** The most the stated promise lets through in that time. */
    bound: number;
    maxIn1s: number;
    /** The most the stated promise lets through in any 1 s. */
    boundIn1s: number;
    denied: number;
    errors: number;
  };
  boundary: { allowed: number; maxIn1s: number; maxIn200ms: number; boundIn1s: number; boundIn200ms: number };
  kept: boolean;
}

export interface Target {
  name: string;
  goal: string;
  measured: string;
  met: boolean;
}
