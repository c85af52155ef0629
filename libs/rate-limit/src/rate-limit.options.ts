import type { Cluster, Redis, RedisOptions } from 'ioredis';
import type { ExecutionContext } from '@nestjs/common';
import type { LeaseOption, LeaseSettings, RateLimitPolicy } from './rate-limit.interfaces.js';
import type { RateLimitDecisionEvent } from './events/rate-limit-events.js';
import type { MeterProvider } from '@opentelemetry/api';
import type { BucketStore } from './stores/bucket-store.interface.js';

export type FailureMode = 'open' | 'closed' | 'local';
export type StandardHeaders = 'draft-6' | 'draft-7' | 'draft-8' | false;
/** How `app.init()` checks a Redis connection the module creates (see `RateLimitModuleOptions.startupCheck`). */
export type StartupCheck = 'default' | 'strict' | false;

/** How the limiter finds the identity behind a request. */
export interface RateLimitKeyOptions {
  /** Request header that carries the API key for `keyBy: 'apiKey'`. Default `'x-api-key'`. */
  apiKeyHeader?: string;
  /** The user id for `keyBy: 'user'`. Default: `req.user.id`, else `req.user.userId`, else `req.user.sub`. */
  user?: (request: any) => string | number | undefined;
  /**
   * The verified API key (or the identity it belongs to, after a lookup) for `keyBy: 'apiKey'`; undefined
   * when the request has no valid key, which then falls back to the IP bucket. Default: none, and the raw
   * `apiKeyHeader` value is used, which lets a client pick a new bucket per request (start-up warns,
   * naming the routes that no enforced per-IP policy bounds).
   */
  apiKey?: (request: any) => string | undefined | Promise<string | undefined>;
  /** Secret of the HMAC that digests API keys and hashed identities in key names. Default: none (plain SHA-256). */
  secret?: string;
}

/** Options of `RateLimitModule.forRoot()` / `forRootAsync()`. */
export interface RateLimitModuleOptions {
  /**
   * Redis URL, ioredis options, or a client you own (Redis or Cluster; you close it). Default
   * `'redis://127.0.0.1:6379'`. Refused beside a `store` object of your own, which holds its own connection.
   */
  redis?: string | RedisOptions | Redis | Cluster;
  /**
   * `'redis'` (default) shares buckets across instances; `'memory'` keeps them in this process only; or a
   * `BucketStore` of your own (you close it), kept to the contract on `BucketStore` and checked by
   * `verifyBucketStore` of `nest-redis-rate-limit/testing`. `remote: true` gets `timeoutMs`, breakers, the deny
   * cache and `failureMode`, like Redis; `remote: false` is called directly, like memory.
   */
  store?: 'redis' | 'memory' | BucketStore;
  /** Prefix of every Redis key the limiter writes. Default `'rl:'`. */
  keyPrefix?: string;
  /**
   * What a request gets when Redis errors or times out: `'local'` (default) decides it in an in-process
   * bucket with the same policy (each instance keeps the limit on its own: N instances admit at most N
   * times it; memory bounded by `maxLocalBuckets`), `'closed'` answers 503, `'open'` allows it unlimited.
   */
  failureMode?: FailureMode;
  /** Longest wait for one decision from Redis, in ms. Default 100. */
  timeoutMs?: number;
  /** Send `X-RateLimit-Limit`, `-Remaining` and `-Reset`. Default true. */
  legacyHeaders?: boolean;
  /** Which IETF draft's `RateLimit*` headers to send, or false for none. Default `'draft-6'`. */
  standardHeaders?: StandardHeaders;
  /** Where identities come from. */
  keys?: RateLimitKeyOptions;
  /** Policies for every HTTP route that has no `@RateLimit()` of its own. Default: none (unlimited). */
  defaults?: RateLimitPolicy | RateLimitPolicy[];
  /** After Redis denies a bucket, deny it here without a Redis call until its next token can exist (only what Redis would deny). Default true. */
  denyCache?: boolean;
  /**
   * Decisions that arrive in the same event-loop turn (per Redis Cluster slot) share one script call:
   * the first goes out at once, the rest at the end of the turn, each still decided atomically on its
   * own. Fewer calls, less Redis CPU per decision under load; nothing waits when traffic is light.
   * `false`: one call per decision. Default true.
   */
  coalesce?: boolean;
  /** Register `RateLimitGuard` for the whole application. `false` when you place the guard yourself. Default true. */
  guard?: boolean;
  /** `false`: shadow mode for every policy without its own `enforce` (decide and drain, never refuse). Default true. */
  enforce?: boolean;
  /**
   * Leased mode (docs/explanation/leases.md) for every route policy without its own `lease`: `true`,
   * `false` or `{ lifeMs?, maxBatch? }`. Default false: every decision is one Redis call.
   */
  lease?: LeaseOption;
  /** Skip every policy of a request when it answers true. Runs in each phase that has policies. */
  skipIf?: (context: ExecutionContext) => boolean | Promise<boolean>;
  /** Never limited: requests from these addresses or CIDR ranges, and policies keyed by these users or API keys. */
  allowList?: RateLimitAllowList;
  /** Called for every policy decided (after the store answered, or failureMode did). Must not throw; errors are logged. */
  onDecision?: (event: RateLimitDecisionEvent) => void;
  /** How long a `RateLimitResolver`'s answer is reused for one identity, in ms. 0: ask it on every request. Default 1000. */
  resolverCacheMs?: number;
  /**
   * The most buckets held in this process, by `store: 'memory'` and by the `failureMode: 'local'`
   * fallback: beyond it, full buckets are swept and then the least recently used is forgotten (it
   * starts full again; logged). Default 100,000.
   */
  maxLocalBuckets?: number;
  /**
   * OpenTelemetry metrics (see the README's "Metrics"). Default: recorded through the global
   * MeterProvider if the app registered one before `app.init()` / `listen()`, else nothing is recorded
   * and nothing subscribed. `true`: the same, with a start-up warning when there is none. `false`: off.
   * `{ meterProvider }`: recorded through that provider, registered globally or not.
   */
  metrics?: boolean | { meterProvider: MeterProvider };
  /**
   * How `app.init()` checks the Redis client the module creates (never a client you pass in), once: it
   * connects and runs the limiter's script on a probe key. `'default'`: misconfiguration fails the start
   * (credentials refused, the ACL refuses the limiter's commands or keys, TLS verification fails), naming
   * host:port and the cause; an outage (connection refused, no answer within 1 s, a host name that does
   * not resolve yet) is logged at error level and the app starts under `failureMode`. `'strict'`: a host
   * name that does not resolve fails the start too. `false`: no check; connection errors are warnings.
   * Default `'default'`.
   */
  startupCheck?: StartupCheck;
  /** `BucketService.acquire()` and `@Paced`: how long a call may wait for its tokens, and how many may wait. */
  acquire?: RateLimitAcquireOptions;
  /**
   * The operator's side: analytics of who is limited, limits overridden live, the deny list, read and
   * changed through `RateLimitInsights` and the dashboard (`RateLimitDashboardModule`). `true`: on with
   * its defaults. Default: off — it keeps identities (addresses, user ids, API-key digests) in Redis
   * for `retentionHours`, and each instance makes one call every `syncMs`; both are the app owner's choice.
   */
  operations?: boolean | RateLimitOperationsOptions;
}

/** Options of the operator's side (`operations`). */
export interface RateLimitOperationsOptions {
  /**
   * Count allowed and refused decisions per policy and identity in memory (the top `topK` identities
   * per policy, totals exact) and write them with the periodic call. Default true.
   */
  analytics?: boolean | { topK?: number; retentionHours?: number };
  /** Period of the one call per instance that writes analytics and reads overrides and blocks, in ms (250 to 10,000). Default 1000. */
  syncMs?: number;
  /** What a blocked identity gets: 429 with `Retry-After` until the block ends (default), or 403. */
  blockedStatus?: 429 | 403;
}

/** Options of waiting for tokens (`BucketService.acquire()`, `@Paced`). */
export interface RateLimitAcquireOptions {
  /**
   * The longest wait of any call, in ms, and the default of a call's own `maxWaitMs` (which may only be
   * shorter). It also bounds how far below 0 reservations may take a bucket: tokens further below are
   * treated as damage and repaired. Give every instance that shares buckets the same value. Default 60,000.
   */
  maxWaitMs?: number;
  /** Calls waiting at once in this process (each holds a timer and its reservation); one more is refused. Default 10,000. */
  maxWaiting?: number;
}

/** Callers that are never limited (health checkers, internal services). */
export interface RateLimitAllowList {
  /** Addresses (`10.1.2.3`, `::1`) and CIDR ranges (`10.0.0.0/8`, `fd00::/8`): every policy of their requests is skipped. */
  ips?: string[];
  /** User ids: policies with `keyBy: 'user'` are skipped for them. */
  users?: Array<string | number>;
  /** API keys (as `keys.apiKey` answers them, or the raw header): policies with `keyBy: 'apiKey'` are skipped for them. */
  apiKeys?: string[];
}

/** The options after defaults are applied. */
export interface ResolvedRateLimitOptions {
  redis: string | RedisOptions | Redis | Cluster;
  store: 'redis' | 'memory' | BucketStore;
  keyPrefix: string;
  failureMode: FailureMode;
  timeoutMs: number;
  legacyHeaders: boolean;
  standardHeaders: StandardHeaders;
  apiKeyHeader: string;
  user?: (request: any) => string | number | undefined;
  apiKey?: (request: any) => string | undefined | Promise<string | undefined>;
  secret?: string;
  defaults: RateLimitPolicy[];
  denyCache: boolean;
  coalesce: boolean;
  guard: boolean;
  enforce: boolean;
  /** The module's `lease`, resolved; undefined: off. */
  lease: LeaseSettings | undefined;
  skipIf?: (context: ExecutionContext) => boolean | Promise<boolean>;
  allowList: { ips: string[]; users: Set<string>; apiKeys: Set<string> };
  onDecision?: (event: RateLimitDecisionEvent) => void;
  resolverCacheMs: number;
  maxLocalBuckets: number;
  metrics: ResolvedMetricsOption;
  startupCheck: StartupCheck;
  /** `acquire.maxWaitMs`. */
  acquireMaxWaitMs: number;
  /** `acquire.maxWaiting`. */
  acquireMaxWaiting: number;
  operations: ResolvedOperationsOptions;
}

/** `operations` after defaults. */
export interface ResolvedOperationsOptions {
  enabled: boolean;
  analytics: { enabled: boolean; topK: number; retentionHours: number };
  syncMs: number;
  blockedStatus: 429 | 403;
}

/** How the metrics find their MeterProvider: not at all, the global one at application bootstrap, or the one given. */
export type ResolvedMetricsOption =
  | { mode: 'off' }
  /** `warn`: `metrics: true` was set explicitly, so a missing SDK is logged at start-up. */
  | { mode: 'global'; warn: boolean }
  | { mode: 'provider'; meterProvider: MeterProvider };
