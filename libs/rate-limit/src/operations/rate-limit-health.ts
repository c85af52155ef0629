import { Inject, Injectable } from '@nestjs/common';
import { RATE_LIMIT_OPTIONS } from '../rate-limit.module-definition.js';
import type { FailureMode, ResolvedRateLimitOptions } from '../rate-limit.options.js';
import { LiveOperations } from './live-operations.js';
import { BucketService } from '../bucket/bucket.service.js';

/** What `RateLimitHealth.status()` answers: is the limiter limiting right now, and how. */
export interface RateLimitStatus {
  /**
   * `'up'`: the store decides. `'degraded'`: it cannot be asked now or its last calls failed, and
   * `failureMode` decides meanwhile (`reason` says why and what requests get).
   */
  status: 'up' | 'degraded';
  /** Where buckets live: Redis, this process (`store: 'memory'`), or a store of the application's. */
  store: 'redis' | 'memory' | 'custom';
  failureMode: FailureMode;
  /** Whether the store can be asked now (the Redis client is connected and ready). */
  reachable: boolean;
  /** The nodes (`host:port`, or 'the store') whose last call failed or timed out. */
  failingNodes: string[];
  /** Decisions `failureMode` made in the last minute, by every route and `BucketService` call of this instance. */
  fallbackDecisionsLastMinute: number;
  /** While degraded: what is wrong and what requests get meanwhile. */
  reason?: string;
  /**
   * With `operations` on: the overrides and blocks this instance applies now, and whether its periodic
   * call (which keeps them current) fails; then they are as last read, and the status says so.
   */
  operations?: { overrides: number; blocks: number; syncFailing: boolean; lastSyncAt?: number };
}

/** One entry of `RateLimitHealth.check()`'s result: terminus' `{ status, ...details }`. */
export type RateLimitIndicator = { status: 'up' | 'down'; degraded: boolean } & Omit<RateLimitStatus, 'status'>;

/** What `failureMode` gives while the store cannot decide, in words for the status. */
const FALLBACK: Record<FailureMode, string> = {
  local: "decisions follow failureMode 'local' (in-process buckets: each instance keeps the limit on its own)",
  open: "decisions follow failureMode 'open' (requests are not limited)",
  closed: "decisions follow failureMode 'closed' (limited requests are refused with 503)",
};

/**
 * Is the limiter limiting right now? A plain status for an admin endpoint or a log (`status()`), and the
 * same in the shape of a health indicator of @nestjs/terminus (`check()`), without depending on it.
 * Reads what this instance already knows (the client's state, the breakers, the fallback's count): no
 * call to Redis.
 */
@Injectable()
export class RateLimitHealth {
  constructor(
    private readonly buckets: BucketService,
    @Inject(RATE_LIMIT_OPTIONS) private readonly options: ResolvedRateLimitOptions,
    private readonly live: LiveOperations,
  ) {}

  status(): RateLimitStatus {
    const { failingNodes, lastError, fallbackDecisionsLastMinute, reachable } = this.buckets.storeHealth();
    const store = typeof this.options.store === 'object' ? 'custom' : this.options.store;
    const { failureMode } = this.options;
    const status: RateLimitStatus = {
      status: reachable && failingNodes.length === 0 ? 'up' : 'degraded',
      store,
      failureMode,
      reachable,
      failingNodes,
      fallbackDecisionsLastMinute,
    };
    if (this.live.enabled) {
      const { overrides, blocks, syncFailing, lastSyncAt } = this.live.status();
      status.operations = { overrides, blocks, syncFailing, ...(lastSyncAt !== undefined ? { lastSyncAt } : {}) };
    }
    if (status.status === 'degraded') {
      const what =
        failingNodes.length > 0
          ? `the store failed (${failingNodes.join(', ')}): ${lastError ?? 'no answer'}`
          : 'the store is not connected';
      status.reason = `${what}; ${FALLBACK[failureMode]}`;
    }
    return status;
  }

  /**
   * The status as @nestjs/terminus' `HealthIndicatorResult`: `{ [key]: { status, ...details } }`. The
   * limiter is `'up'` while it limits, on its fallback too (then `degraded: true` and the reason): an
   * instance whose Redis is away still serves, so a readiness probe should not take it out. It is
   * `'down'` only when it is degraded under `failureMode: 'closed'`, where every limited request is
   * refused: then it rejects as terminus' indicators do, with an error whose `causes` is that result
   * (terminus reads `causes`; its own `HealthCheckError` is not needed).
   */
  check(key = 'rateLimit'): Promise<Record<string, RateLimitIndicator>> {
    const { status, ...details } = this.status();
    const degraded = status === 'degraded';
    const up = !(degraded && details.failureMode === 'closed');
    const result = { [key]: { status: up ? ('up' as const) : ('down' as const), degraded, ...details } };
    if (up) return Promise.resolve(result);
    return Promise.reject(
      Object.assign(new Error(`rate limiting is down: ${details.reason}`), { causes: result, isHealthCheckError: true }),
    );
  }
}
