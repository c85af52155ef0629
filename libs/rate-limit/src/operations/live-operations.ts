import { Inject, Injectable, Logger, type OnApplicationBootstrap, type OnModuleDestroy } from '@nestjs/common';
import type { ChainableCommander, Cluster, Redis } from 'ioredis';
import { RateLimitConfigError, reasonOf } from '../errors/rate-limit.errors.js';
import { RATE_LIMIT_OPTIONS } from '../rate-limit.module-definition.js';
import type { ResolvedRateLimitOptions } from '../rate-limit.options.js';
import { BucketStore } from '../stores/bucket-store.interface.js';
import { MemoryBucketStore } from '../stores/memory/memory-bucket.store.js';
import { RedisBucketStore } from '../stores/redis/redis-bucket.store.js';
import type { AnalyticsBackend } from './analytics/analytics-backend.js';
import { RedisAnalytics } from './analytics/analytics-store.js';
import { DecisionCounts } from './analytics/decision-counts.js';
import { MemoryAnalytics } from './analytics/memory-analytics.js';
import { ControlState } from './control/control-state.js';
import { type ControlStore, MemoryControlStore, RedisControlStore } from './control/control-store.js';

/**
 * What the periodic call writes beside reading the control version: the analytics of the decisions
 * counted since the last call. `appendTo` adds its commands to the call's pipeline (Redis) and answers
 * what to do once the call is answered (`settled(ok)`: on failure, the counts are kept for the next call).
 */
export interface PeriodicWriter {
  appendTo(pipeline: ChainableCommander | undefined, nowMs: number): ((ok: boolean) => void) | undefined;
}

/** Counts each decision for the analytics (`operations.analytics`): cheap, in memory, no store call. */
export interface DecisionRecorder {
  record(scope: string, identity: string, allowed: boolean): void;
}

/** How the operator's side is doing on this instance. */
export interface OperationsStatus {
  /** `operations` is on. */
  enabled: boolean;
  /** Overrides and blocks in force, as this instance applies them. */
  overrides: number;
  blocks: number;
  /** When the last periodic call was answered (epoch ms). */
  lastSyncAt: number | undefined;
  /** The last periodic call failed: what is in force is what the call before it read. */
  syncFailing: boolean;
  /** Why, while failing. */
  syncError?: string;
}

/**
 * The operator's side of one instance: the overrides and blocks in force (`control`, read by every
 * request with no store call) and the periodic call that keeps them current and writes the analytics.
 *
 * One call every `operations.syncMs` while the application runs (one pipeline of commands that all
 * share the `{ops}` hash tag: one round trip to one node, on a Cluster too): the analytics counted since
 * the last call, and the version of the overrides and blocks; only when the version changed, a second
 * call reads them. A failed call keeps what is in force and the counts (bounded) for the next one.
 * Nothing when `operations` is off.
 */
@Injectable()
export class LiveOperations implements OnApplicationBootstrap, OnModuleDestroy {
  readonly control = new ControlState();
  /** Where changes are written; undefined when `operations` is off. */
  readonly store: ControlStore | undefined;
  readonly enabled: boolean;
  /** The analytics' counts of this instance; undefined when analytics are off. */
  readonly counts: DecisionRecorder | undefined;
  /** Where the counts go and are read back; undefined when analytics are off. */
  readonly analytics: AnalyticsBackend | undefined;
  private readonly client: Redis | Cluster | undefined;
  private readonly writers: PeriodicWriter[] = [];
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<void> | undefined;
  private lastSyncAt: number | undefined;
  private syncError: string | undefined;
  private readonly logger = new Logger('RateLimit');

  constructor(
    @Inject(RATE_LIMIT_OPTIONS) private readonly options: ResolvedRateLimitOptions,
    @Inject(BucketStore) bucketStore: BucketStore,
  ) {
    this.enabled = options.operations.enabled;
    if (!this.enabled) return;
    if (bucketStore instanceof RedisBucketStore) {
      this.client = bucketStore.client as Redis | Cluster;
      this.store = new RedisControlStore(this.client, options.keyPrefix);
    } else if (bucketStore instanceof MemoryBucketStore) {
      this.store = new MemoryControlStore();
    } else {
      throw new RateLimitConfigError(
        'ERR_RATE_LIMIT_OPERATIONS_STORE',
        'RateLimitModule: operations needs the Redis store or the memory store; a store of your own has nowhere to keep overrides, blocks and analytics',
      );
    }
    const { analytics } = options.operations;
    if (analytics.enabled) {
      const counts = new DecisionCounts(analytics.topK);
      const backend =
        this.client !== undefined ? new RedisAnalytics(this.client, options.keyPrefix, analytics) : new MemoryAnalytics(analytics);
      this.counts = counts;
      this.analytics = backend;
      this.addWriter({
        appendTo(pipeline, nowMs) {
          const snapshot = counts.take();
          if (snapshot === undefined) return undefined;
          backend.flush(snapshot, nowMs, pipeline);
          return (ok) => {
            if (!ok) counts.restore(snapshot);
          };
        },
      });
    }
  }

  /** Adds what the periodic call writes (the analytics). */
  addWriter(writer: PeriodicWriter): void {
    this.writers.push(writer);
  }

  /** The first read before the app serves (bounded: an unreachable Redis does not hold the start), then one call per `syncMs`. */
  async onApplicationBootstrap(): Promise<void> {
    if (!this.enabled) return;
    await this.sync();
    this.timer = setInterval(() => void this.sync(), this.options.operations.syncMs);
    this.timer.unref();
  }

  /** The last counts are written before the connection closes (bounded like every call). */
  async onModuleDestroy(): Promise<void> {
    if (this.timer !== undefined) clearInterval(this.timer);
    this.timer = undefined;
    if (!this.enabled) return;
    await this.running;
    await this.sync();
  }

  /** One periodic call; a call still running is waited for, never doubled. */
  sync(): Promise<void> {
    if (this.running !== undefined) return this.running;
    this.running = this.syncOnce().finally(() => (this.running = undefined));
    return this.running;
  }

  status(): OperationsStatus {
    const status: OperationsStatus = {
      enabled: this.enabled,
      overrides: this.control.overridesInForce.length,
      blocks: this.control.blocksInForce.length,
      lastSyncAt: this.lastSyncAt,
      syncFailing: this.syncError !== undefined,
    };
    if (this.syncError !== undefined) status.syncError = this.syncError;
    return status;
  }

  private async syncOnce(): Promise<void> {
    const now = Date.now();
    const settles: Array<(ok: boolean) => void> = [];
    try {
      let version: string | undefined;
      if (this.client !== undefined) {
        const pipeline = this.client.pipeline();
        for (const writer of this.writers) {
          const settle = writer.appendTo(pipeline, now);
          if (settle !== undefined) settles.push(settle);
        }
        pipeline.get((this.store as RedisControlStore).versionKey);
        const results = await this.bounded(pipeline.exec());
        const failed = (results ?? []).find(([error]) => error !== null);
        if (failed !== undefined) throw failed[0];
        version = ((results ?? []).at(-1)?.[1] as string | null) ?? undefined;
      } else {
        for (const writer of this.writers) writer.appendTo(undefined, now)?.(true);
        version = await this.store!.version();
      }
      for (const settle of settles.splice(0)) settle(true);
      // '' for a store without a version (nothing was ever changed, or Redis lost its keys).
      if ((version ?? '') !== this.control.version) {
        const snapshot = await this.bounded(this.store!.load());
        this.control.replace(snapshot.version ?? '', snapshot.overrides, snapshot.blocks, Date.now());
      } else if (this.control.active) {
        // Nothing changed, but entries may have ended since they were read.
        this.control.replace(this.control.version, this.control.overridesInForce, this.control.blocksInForce, Date.now());
      }
      if (this.syncError !== undefined) this.logger.log('Rate-limit operations: the periodic call succeeds again');
      this.syncError = undefined;
      this.lastSyncAt = Date.now();
    } catch (error) {
      for (const settle of settles) settle(false);
      if (this.syncError === undefined) {
        this.logger.warn(
          `Rate-limit operations: the periodic call failed (${reasonOf(error)}); overrides and blocks stay as last read, analytics are kept for the next call`,
        );
      }
      this.syncError = reasonOf(error);
    }
  }

  /** A call bounded by the larger of `syncMs` and 5 × `timeoutMs`: a hung connection never stacks calls. */
  private bounded<T>(call: Promise<T>): Promise<T> {
    const ms = Math.max(this.options.operations.syncMs, 5 * this.options.timeoutMs);
    let timer: NodeJS.Timeout | undefined;
    const deadline = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`no answer within ${ms} ms`)), ms);
    });
    call.catch(() => undefined);
    return Promise.race([call, deadline]).finally(() => clearTimeout(timer));
  }
}
