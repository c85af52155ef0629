import { performance } from 'node:perf_hooks';
import type { RateLimitEvents } from '../events/rate-limit-events.js';
import { RateLimitError, RateLimitTimeoutError, RateLimitUnavailableError } from '../errors/rate-limit.errors.js';
import type { Verdict, VerdictSource } from '../rate-limit.interfaces.js';
import type { FailureMode, ResolvedRateLimitOptions } from '../rate-limit.options.js';
import type { BucketStore, ReservationMark, ReserveOptions, TakeOptions, TakeResult } from '../stores/bucket-store.interface.js';
import type { CombinedSlotStore, SlotRequest } from '../stores/slots.js';
import { type BucketRequest, mergeRepeatedKeys } from '../stores/token-bucket.js';
import { ThrottledLogger } from '../throttled-logger.js';
import { type Breaker, Breakers } from './breakers.js';
import { DenyCache } from './deny-cache.js';
import { Fallback, type Reservation } from './fallback.js';
import { toVerdict } from './to-verdict.js';
import type { MemoryBucketStore } from '../stores/memory/memory-bucket.store.js';
import { Deadlines, withTimeout } from './with-timeout.js';
import { type LeaseAnswer, type LeaseAsk, LeaseBook, leases, type LeasingStore } from './lease-book.js';
import { LeasedPath } from './leased-path.js';
import { type SlotVerdict, takeWithSlot } from './slot-verdict.js';

export type { SlotVerdict } from './slot-verdict.js';

/** What `DecisionEngine.health()` answers. */
export interface EngineHealth {
  /** The nodes (`host:port`, or 'the store') whose last call failed or timed out: their breakers are open. */
  failingNodes: string[];
  /** What the last failure said, while a node fails. */
  lastError: string | undefined;
  /** Decisions `failureMode` made in the last minute. */
  fallbackDecisionsLastMinute: number;
}

/**
 * Decisions over a store, as resilient as one process can make them: each one within `timeoutMs`
 * (deadlines), a denial the store gave recently repeated without asking it (deny cache), a failing node
 * asked by one decision at a time (breakers), and `failureMode` deciding meanwhile (fallback).
 */
export class DecisionEngine {
  private readonly logger = new ThrottledLogger('RateLimit');
  /** Keys that hold another type: throttled apart from the store's failures, so that neither hides the other. */
  private readonly keyLogger = new ThrottledLogger('RateLimit');
  private readonly fallback: Fallback;
  private readonly breakers: Breakers;
  /** Denials this instance can repeat without asking the store; undefined when off or the store is local. */
  private readonly denyCache: DenyCache | undefined;
  /** The timeout of every decision, one timer for all of them. */
  private readonly deadlines: Deadlines;
  /** This instance's leases of leased policies' buckets; undefined when the store cannot lease (then they are exact). */
  private readonly leases: LeaseBook | undefined;
  /** Decisions with leased buckets, over `leases`. */
  private readonly leased: LeasedPath | undefined;

  constructor(
    private readonly store: BucketStore,
    private readonly options: ResolvedRateLimitOptions,
    private readonly events: RateLimitEvents,
  ) {
    // A reset is remembered longer than any answer can be on its way (they come within timeoutMs, or are dropped).
    this.denyCache =
      options.denyCache && store.remote ? new DenyCache(undefined, undefined, Math.max(60_000, 2 * options.timeoutMs)) : undefined;
    this.fallback = new Fallback(options);
    this.breakers = new Breakers(store, options.failureMode, this.fallback, this.logger);
    this.deadlines = new Deadlines(options.timeoutMs);
    this.leases =
      store.remote && leases(store)
        ? new LeaseBook((request, ask, sent) => this.leaseCall(store, request, ask, sent), options.maxLocalBuckets)
        : undefined;
    this.leased =
      this.leases === undefined
        ? undefined
        : new LeasedPath(
            this.leases,
            (requests, dryRun) => this.decideExact(requests, dryRun),
            (requests) => this.refundDistinct(requests, 'store', undefined),
            this.fallback,
          );
  }

  /** The application is closing: the leases give their unspent tokens back. */
  async close(): Promise<void> {
    await this.leases?.close();
  }

  /** True while the store keeps failing (a breaker is open). */
  get storeFailing(): boolean {
    return this.breakers.failing;
  }

  /** How the store has answered lately: the nodes whose last call failed, what it said, and `failureMode`'s decisions of the last minute. */
  health(): EngineHealth {
    const failingNodes = [...this.breakers.open.keys()].map((node) => node || 'the store');
    return {
      failingNodes,
      lastError: failingNodes.length > 0 ? this.breakers.lastError : undefined,
      fallbackDecisionsLastMinute: this.fallback.lastMinute(),
    };
  }

  /**
   * One atomic decision over `requests`, never waiting longer than `timeoutMs` for a remote store.
   * A request the store would deny for sure (`denyCache`) is denied without asking it. When the store fails, `failureMode` decides. Once it has failed several times in a row, one
   * decision at a time asks it (the probe) and the others follow `failureMode` at once: a hung Redis
   * costs one request per `timeoutMs` a wait instead of every request, and no pile of stale commands
   * builds up for it. A single slow reply does not trip this. The first call that succeeds ends the
   * outage; no timer, no restart.
   */
  async decide(requests: readonly BucketRequest[], dryRun = false): Promise<Verdict> {
    // A key named twice (consumeAll, or stacked policies that meet on one identity at run time) is one
    // bucket: decided once for the summed cost, and its decision reported for each request.
    const merged = mergeRepeatedKeys(requests);
    if (merged === undefined) return this.decideDistinct(requests, dryRun);
    const verdict = await this.decideDistinct(merged.requests, dryRun);
    return { ...verdict, decisions: merged.positions.map((j) => ({ ...verdict.decisions[j] })) };
  }

  private decideDistinct(requests: readonly BucketRequest[], dryRun: boolean): Promise<Verdict> {
    if (this.leased !== undefined && !dryRun) {
      for (let i = 0; i < requests.length; i++) if (requests[i].lease !== undefined) return this.leased.decide(requests);
    }
    return this.decideExact(requests, dryRun);
  }

  /** One lease call, within `timeoutMs` and through the breakers like a decision; rejects when the store fails. */
  private leaseCall(store: BucketStore & LeasingStore, request: BucketRequest, ask: LeaseAsk, sent: () => void): Promise<LeaseAnswer> {
    return this.guarded(request.key, (onSent) =>
      store.lease(request, ask, undefined, () => {
        sent();
        onSent();
      }),
    );
  }

  /**
   * One store call about `key` beside the decisions (a lease, a concurrency slot): within `timeoutMs` of
   * its write on a remote store, through the breakers like a decision. Rejects when the store fails, and
   * with `RateLimitUnavailableError` when its node's breaker is open and another call probes it: the
   * caller applies its `failureMode`.
   */
  async guarded<T>(key: string, call: (sent: () => void) => Promise<T>): Promise<T> {
    const requests = [{ key } as BucketRequest];
    let probes: Breaker[] | undefined;
    if (this.breakers.open.size > 0) {
      const found = this.breakers.probesFor(requests);
      if (found === 'fallback') throw new RateLimitUnavailableError('the store is failing');
      probes = found;
    }
    try {
      const answer = this.store.remote ? await this.deadlines.raceSent(call) : await call(() => undefined);
      if (this.breakers.open.size > 0) this.breakers.recovered(requests);
      return answer;
    } catch (error) {
      if (!(error instanceof RateLimitUnavailableError)) this.failed(error, requests);
      throw error;
    } finally {
      probes?.forEach((probe) => (probe.probing = false));
    }
  }

  /** The in-process store of `failureMode: 'local'` (its buckets and slots), and a decision it made, counted for the health status. */
  get localFallback(): { store: MemoryBucketStore; count(): void } {
    return { store: this.fallback.local, count: () => this.fallback.count() };
  }

  /**
   * One atomic take of `requests` and one concurrency slot, in one store call, as `decide()` makes a take
   * (slot-verdict.ts).
   */
  decideWithSlot(requests: readonly BucketRequest[], slot: SlotRequest, store: CombinedSlotStore): Promise<SlotVerdict> {
    return takeWithSlot(
      (distinct, send) => this.decideExact(distinct, false, send),
      (key, call) => this.guarded(key, call),
      requests,
      slot,
      store,
    );
  }

  private async decideExact(
    requests: readonly BucketRequest[],
    dryRun: boolean,
    send: (options: TakeOptions | undefined) => Promise<TakeResult> = (options) => this.store.take(requests, options),
  ): Promise<Verdict> {
    const cache = dryRun ? undefined : this.denyCache;
    const sentAt = cache === undefined ? 0 : cache.now();
    const denied = cache?.deny(requests, sentAt);
    if (denied !== undefined) return toVerdict(requests, { allowed: false, tokens: denied }, 'cache');
    const options: TakeOptions | undefined = dryRun ? { dryRun } : undefined;
    // Healthy, nothing to look up; else the breakers of this decision's nodes: one open and probed already
    // sends it to failureMode, one open and not probed makes it the probe.
    let probes: Breaker[] | undefined;
    if (this.breakers.open.size > 0) {
      const found = this.breakers.probesFor(requests);
      if (found === 'fallback') return this.fallback.decide(requests, options);
      probes = found;
    }
    const timed = this.events.storeWatched;
    // The store's latency, like its deadline, runs from the write: a decision that waited for the turn's
    // shared call did not wait for Redis meanwhile (a call refused before any write counts from here).
    let started = timed ? performance.now() : 0;
    try {
      const result = this.store.remote
        ? await this.deadlines.raceSent((sent) =>
            send({
              dryRun,
              sent: timed
                ? () => {
                    started = performance.now();
                    sent();
                  }
                : sent,
            }),
          )
        : await send(options);
      if (timed) this.events.storeCall({ durationMs: performance.now() - started, outcome: 'ok' });
      if (this.breakers.open.size > 0) this.breakers.recovered(requests);
      cache?.learn(requests, result, sentAt);
      return toVerdict(requests, result, 'store');
    } catch (error) {
      if (timed) this.events.storeCall({ durationMs: performance.now() - started, outcome: 'error' });
      this.failed(error, requests);
      return this.fallback.decide(requests, options);
    } finally {
      probes?.forEach((probe) => (probe.probing = false));
    }
  }

  /**
   * Reserves `request.cost` in its bucket (`BucketService.acquire()`), within `timeoutMs`, through the
   * breakers like a decision; when the store fails, `failureMode` (the call's own, or the module's)
   * answers. A reservation that timed out may still have been made in Redis: when its late reply says
   * so, it is given back. Reservations never go through the deny cache (a refusal there is a wait).
   */
  async reserve(request: BucketRequest, reserve: ReserveOptions, failureMode: FailureMode): Promise<Reservation> {
    const requests = [request];
    let probes: Breaker[] | undefined;
    if (this.breakers.open.size > 0) {
      const found = this.breakers.probesFor(requests);
      if (found === 'fallback') return this.fallback.reserve(request, reserve, failureMode);
      probes = found;
    }
    let pending: Promise<TakeResult> | undefined;
    try {
      const result = this.store.remote
        ? await this.deadlines.raceSent((sent) => (pending = this.store.take(requests, { reserve, sent })))
        : await this.store.take(requests, { reserve });
      if (typeof result.waitMs !== 'number' || !(result.waitMs >= 0)) {
        throw new RateLimitError(
          'ERR_RATE_LIMIT_STORE_CONTRACT',
          `BucketStore: a reservation's answer has no waitMs (got ${String(result.waitMs)})`,
        );
      }
      if (this.breakers.open.size > 0) this.breakers.recovered(requests);
      const turnAt = typeof result.nowMs === 'number' ? result.nowMs + result.waitMs : undefined;
      return { source: 'store', allowed: result.allowed, tokens: result.tokens[0], waitMs: result.waitMs, turnAt, mark: markOf(result) };
    } catch (error) {
      if (error instanceof RateLimitTimeoutError && pending !== undefined) {
        pending.then(
          (late) => (late.allowed && request.cost > 0 ? this.giveBack(requests, 'store', markOf(late)) : undefined),
          () => undefined,
        );
      }
      this.failed(error, requests, failureMode);
      return this.fallback.reserve(request, reserve, failureMode);
    } finally {
      probes?.forEach((probe) => (probe.probing = false));
    }
  }

  /**
   * Gives back what an allowed decision of `source` took, capped at capacity: the store's buckets, or the
   * in-process ones of `failureMode: 'local'`; nothing was taken in `'open'` mode. Answers the tokens
   * after the refund, or undefined when there was nothing to give back or the store failed (then the
   * tokens come back by refilling). Never waits longer than `timeoutMs`.
   */
  async giveBack(requests: readonly BucketRequest[], source: VerdictSource, givesBack?: ReservationMark): Promise<number[] | undefined> {
    const merged = mergeRepeatedKeys(requests);
    if (merged === undefined) return this.refundDistinct(requests, source, givesBack);
    const tokens = await this.refundDistinct(merged.requests, source, undefined);
    return tokens === undefined ? undefined : merged.positions.map((j) => tokens[j]);
  }

  private async refundDistinct(
    requests: readonly BucketRequest[],
    source: VerdictSource,
    givesBack: ReservationMark | undefined,
  ): Promise<number[] | undefined> {
    const refund: TakeOptions = givesBack === undefined ? { refund: true } : { refund: true, givesBack };
    if (source === 'local') return this.fallback.local.takeSync(requests, refund).tokens;
    if (source !== 'store') return undefined;
    if (this.leased !== undefined && givesBack === undefined) {
      const back = this.leased.backToLeases(requests);
      if (back !== undefined) return back;
    }
    // Forgotten before and after: a denial learned from a request the store decided before the refund is stale.
    for (const request of requests) this.denyCache?.forget(request.key);
    try {
      const { tokens } = await (this.store.remote
        ? this.deadlines.raceSent((sent) => this.store.take(requests, { ...refund, sent }))
        : this.store.take(requests, refund));
      for (const request of requests) this.denyCache?.forget(request.key);
      return tokens;
    } catch (error) {
      this.failed(error, requests);
      return undefined;
    }
  }

  /**
   * A call that failed: the store failing counts toward its nodes' breakers; a key that holds another
   * type (\`ERR_RATE_LIMIT_UNUSABLE_KEY\`) is that bucket's own problem, logged (throttled) and never counted.
   */
  private failed(error: unknown, requests: readonly BucketRequest[], failureMode = this.options.failureMode): void {
    if (error instanceof RateLimitError && error.code === 'ERR_RATE_LIMIT_UNUSABLE_KEY') {
      this.keyLogger.warn(
        `${error.message}: this decision followed failureMode '${failureMode}'; the others are decided as usual. ` +
          'Delete the key, or give the module a keyPrefix no other application writes under',
      );
      return;
    }
    this.breakers.failed(error, requests);
  }

  /**
   * Deletes one bucket: this instance's deny-cache entry and local bucket, then the store's key. Rejects
   * with `RateLimitUnavailableError` (its cause the store's error) when the store fails or times out.
   *
   * The reset wins over answers still on their way: the deny cache forgets the bucket at once, and again
   * when the store has deleted it, so that no answer to a request sent before then (which Redis may have
   * decided before the delete) is learned afterwards.
   */
  async deleteBucket(key: string): Promise<void> {
    const keys = [key];
    this.denyCache?.forget(key);
    await this.fallback.local.delete(keys);
    try {
      const deleted = this.store.delete(keys);
      await (this.store.remote ? withTimeout(deleted, this.options.timeoutMs) : deleted);
    } catch (error) {
      throw new RateLimitUnavailableError(error);
    }
    this.denyCache?.forget(key);
  }
}

/** A reservation as its answer describes it, for its give-back; undefined when the store did not tell its clock. */
function markOf(result: TakeResult): ReservationMark | undefined {
  return typeof result.nowMs === 'number' ? { tokens: result.tokens[0], nowMs: result.nowMs } : undefined;
}
