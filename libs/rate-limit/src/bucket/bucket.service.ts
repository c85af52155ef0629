import { Inject, Injectable, Optional, ServiceUnavailableException } from '@nestjs/common';
import { performance } from 'node:perf_hooks';
import { RateLimitEvents } from '../events/rate-limit-events.js';
import type { BucketDecision, BucketPolicy } from '../rate-limit.interfaces.js';
import { PROBE_AFTER_FAILURES } from '../rate-limit.constants.js';
import { RATE_LIMIT_OPTIONS } from '../rate-limit.module-definition.js';
import type { FailureMode, ResolvedRateLimitOptions } from '../rate-limit.options.js';
import { createDigest, type Digest, serviceKey } from '../keys/identity.js';
import { ThrottledLogger } from '../throttled-logger.js';
import { assertBucketPolicy, assertCost } from '../policies/policy.js';
import { BucketStore, type TakeOptions, type TakeResult } from '../stores/bucket-store.interface.js';
import { MemoryBucketStore } from '../stores/memory-bucket.store.js';
import { DenyCache } from './deny-cache.js';
import { type BucketRequest, mergeRepeatedKeys, toDecision } from './token-bucket.js';
import { Deadlines, withTimeout } from './with-timeout.js';

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
  | 'closed';

/** One atomic decision over the buckets of a request. */
export interface Verdict {
  allowed: boolean;
  /** One decision per bucket, in request order. */
  decisions: BucketDecision[];
  source: VerdictSource;
}

/** One bucket in a `consumeAll()` call. */
export interface BucketEntry {
  name: string;
  policy: BucketPolicy;
  /** Tokens to take; default 1. */
  cost?: number;
}

/** What a request gets while the store fails, per `failureMode`, for the log. */
const FAILURE_EFFECT: Record<FailureMode, string> = {
  open: 'requests are allowed without a limit',
  closed: 'requests are refused (503)',
  local: 'requests are limited by in-process buckets',
};

/**
 * The store could not decide and `failureMode` is `'closed'`. A `ServiceUnavailableException`, so a
 * Nest application that lets it propagate answers 503 with the same body the guard sends
 * (`{ statusCode: 503, message: 'Rate limiting is unavailable; try again shortly', error: 'Service Unavailable' }`);
 * `cause` says why.
 */
export class RateLimitUnavailableError extends ServiceUnavailableException {
  constructor(cause: unknown) {
    super('Rate limiting is unavailable; try again shortly', {
      description: 'Service Unavailable',
      cause: typeof cause === 'string' ? new Error(`rate-limit store unavailable: ${cause}`) : cause,
    });
    this.name = 'RateLimitUnavailableError';
  }
}

/**
 * Token buckets by name, shared by every instance through the store. Also the decision path of the
 * guard: the timeout and the failure mode live here, once.
 */
@Injectable()
export class BucketService {
  private readonly logger = new ThrottledLogger('RateLimit');
  private readonly local = new MemoryBucketStore();
  /** Store calls that failed since the last one that succeeded. */
  private failuresInARow = 0;
  /** A probe (a decision asking a store that keeps failing) is on its way. */
  private probing = false;
  /** Decisions `failureMode` made in the current outage, for the recovery log line. */
  private degraded = 0;
  /** Denials this instance can repeat without asking the store; undefined when off or the store is local. */
  private readonly denyCache: DenyCache | undefined;
  /** The timeout of every decision, one timer for all of them. */
  private readonly deadlines: Deadlines;
  /** Digest of bucket names that cannot appear in a key as they are. */
  private readonly hash: Digest;

  constructor(
    @Inject(BucketStore) private readonly store: BucketStore,
    @Inject(RATE_LIMIT_OPTIONS) private readonly options: ResolvedRateLimitOptions,
    @Optional() private readonly events: RateLimitEvents = new RateLimitEvents(),
  ) {
    this.denyCache = options.denyCache && store.remote ? new DenyCache() : undefined;
    this.deadlines = new Deadlines(options.timeoutMs);
    this.hash = createDigest(options.secret);
  }

  /**
   * Takes `cost` tokens from the bucket `name` if it has them. With `failureMode: 'closed'` a store
   * failure throws `RateLimitUnavailableError`; with `'open'` the decision is allowed as if the bucket were full.
   */
  async consume(name: string, policy: BucketPolicy, cost = 1): Promise<BucketDecision> {
    // consumeAll() of one entry, without its arrays and its extra await: this is the hot path of callers.
    const verdict = await this.decide([this.request({ name, policy }, cost)]);
    if (verdict.source === 'closed') throw new RateLimitUnavailableError('failureMode is closed');
    return verdict.decisions[0];
  }

  /**
   * Takes from several buckets atomically: all of them have the tokens and are drained, or none is touched.
   * Answers `{ allowed, decisions }`: `decisions[i]` is the decision of `entries[i]`, each with the request's
   * `allowed`; when denied, `retryAfterSeconds` is at least 1 for the buckets that lacked tokens and 0 for
   * those that had them, so the wait of the whole request is the largest one.
   */
  async consumeAll(entries: readonly BucketEntry[]): Promise<{ allowed: boolean; decisions: BucketDecision[] }> {
    const requests = entries.map((entry) => this.request(entry, entry.cost ?? 1));
    assertRepeatsFit(entries, requests);
    const verdict = await this.decide(requests);
    if (verdict.source === 'closed') throw new RateLimitUnavailableError('failureMode is closed');
    return { allowed: verdict.allowed, decisions: verdict.decisions };
  }

  /** What `consume(name, policy)` would decide now, without taking a token. */
  async peek(name: string, policy: BucketPolicy): Promise<BucketDecision> {
    const verdict = await this.decide([this.request({ name, policy }, 1)], true);
    if (verdict.source === 'closed') throw new RateLimitUnavailableError('failureMode is closed');
    return verdict.decisions[0];
  }

  /**
   * Gives `cost` tokens back to the bucket `name` (capped at its capacity), for work that turned out not
   * to count — the refund of an earlier `consume()`. Answers the bucket's decision after the refund
   * (`allowed` true). With `failureMode: 'closed'` a store failure throws `RateLimitUnavailableError`;
   * with `'open'` nothing is given back and the bucket is reported as full.
   */
  async refund(name: string, policy: BucketPolicy, cost = 1): Promise<BucketDecision> {
    const request = this.request({ name, policy }, cost);
    const tokens = await this.giveBack([request], 'store');
    if (tokens === undefined) {
      if (this.options.failureMode === 'closed') throw new RateLimitUnavailableError('failureMode is closed');
      return toDecision(request, request.capacity, 0, true);
    }
    return toDecision(request, tokens[0], 0, true);
  }

  /** True while the store keeps failing (the breaker is open): one decision at a time probes it, the others follow `failureMode`. */
  get storeFailing(): boolean {
    return this.failuresInARow >= PROBE_AFTER_FAILURES;
  }

  /** Makes the bucket `name` full again. */
  async reset(name: string): Promise<void> {
    const keys = [serviceKey(this.options.keyPrefix, name, this.hash)];
    this.denyCache?.forget(keys[0]);
    await this.local.delete(keys);
    const deleted = this.store.delete(keys);
    await (this.store.remote ? withTimeout(deleted, this.options.timeoutMs) : deleted);
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

  private async decideDistinct(requests: readonly BucketRequest[], dryRun: boolean): Promise<Verdict> {
    const cache = dryRun ? undefined : this.denyCache;
    const sentAt = cache === undefined ? 0 : cache.now();
    const denied = cache?.deny(requests, sentAt);
    if (denied !== undefined) return toVerdict(requests, { allowed: false, tokens: denied }, 'cache');
    const options = dryRun ? { dryRun } : undefined;
    const probe = this.failuresInARow >= PROBE_AFTER_FAILURES;
    if (probe && this.probing) return this.fallback(requests, options);
    if (probe) this.probing = true;
    const timed = this.events.storeWatched;
    const started = timed ? performance.now() : 0;
    try {
      const result = this.store.remote
        ? await this.deadlines.race(this.store.take(requests, options))
        : await this.store.take(requests, options);
      if (timed) this.events.storeCall({ durationMs: performance.now() - started, outcome: 'ok' });
      if (this.failuresInARow > 0) this.recovered();
      cache?.learn(requests, result, sentAt);
      return toVerdict(requests, result, 'store');
    } catch (error) {
      if (timed) this.events.storeCall({ durationMs: performance.now() - started, outcome: 'error' });
      this.failed(error);
      return this.fallback(requests, options);
    } finally {
      if (probe) this.probing = false;
    }
  }

  /**
   * Gives back what an allowed decision of `source` took, capped at capacity: the store's buckets, or the
   * in-process ones of `failureMode: 'local'`; nothing was taken in `'open'` mode. Answers the tokens
   * after the refund, or undefined when there was nothing to give back or the store failed (then the
   * tokens come back by refilling). Never waits longer than `timeoutMs`.
   */
  async giveBack(requests: readonly BucketRequest[], source: VerdictSource): Promise<number[] | undefined> {
    const merged = mergeRepeatedKeys(requests);
    if (merged === undefined) return this.refundDistinct(requests, source);
    const tokens = await this.refundDistinct(merged.requests, source);
    return tokens === undefined ? undefined : merged.positions.map((j) => tokens[j]);
  }

  private async refundDistinct(requests: readonly BucketRequest[], source: VerdictSource): Promise<number[] | undefined> {
    if (source === 'local') return this.local.takeSync(requests, { refund: true }).tokens;
    if (source !== 'store') return undefined;
    for (const request of requests) this.denyCache?.forget(request.key);
    try {
      const refunded = this.store.take(requests, { refund: true });
      return (await (this.store.remote ? this.deadlines.race(refunded) : refunded)).tokens;
    } catch (error) {
      this.failed(error);
      return undefined;
    }
  }

  /** The verdict `failureMode` gives while the store cannot decide. */
  private fallback(requests: readonly BucketRequest[], options: TakeOptions | undefined): Verdict {
    this.degraded++;
    const source = this.options.failureMode;
    if (source === 'local') return toVerdict(requests, this.local.takeSync(requests, options), 'local');
    const allowed = source === 'open';
    return {
      allowed,
      source,
      decisions: requests.map((r) => toDecision(r, allowed ? r.capacity - r.cost : 0, r.cost, allowed)),
    };
  }

  private request(entry: BucketEntry, cost: number): BucketRequest {
    const where = `BucketService bucket "${entry.name}"`;
    assertBucketPolicy(entry.policy, where, 'BucketService');
    assertCost(cost, entry.policy.capacity, where, 'BucketService');
    return {
      key: serviceKey(this.options.keyPrefix, entry.name, this.hash),
      capacity: entry.policy.capacity,
      refillPerSecond: entry.policy.refillPerSecond,
      cost,
    };
  }

  private failed(error: unknown): void {
    this.failuresInARow++;
    this.logger.warn(
      `Rate-limit store failed: ${error instanceof Error ? error.message : String(error)}; ` +
        `${FAILURE_EFFECT[this.options.failureMode]} until it answers again (failureMode '${this.options.failureMode}')`,
    );
  }

  private recovered(): void {
    this.failuresInARow = 0;
    const degraded = this.degraded;
    this.degraded = 0;
    this.logger.log(
      `Rate-limit store answers again; ${degraded} decision(s) followed failureMode '${this.options.failureMode}' meanwhile`,
    );
  }
}

function toVerdict(requests: readonly BucketRequest[], result: TakeResult, source: VerdictSource): Verdict {
  const { allowed, tokens } = result;
  return { allowed, source, decisions: requests.map((r, i) => toDecision(r, tokens[i], r.cost, allowed)) };
}

/**
 * A `consumeAll()` that names one bucket twice is merged (`decide`): that needs one policy, and a
 * summed cost the bucket can hold at all, else the call could never be allowed. A caller's mistake,
 * refused like a cost above the capacity in `consume()`.
 */
function assertRepeatsFit(entries: readonly BucketEntry[], requests: readonly BucketRequest[]): void {
  if (requests.length < 2) return;
  const first = new Map<string, number>();
  const costs = new Map<string, number>();
  requests.forEach((request, i) => {
    const j = first.get(request.key);
    if (j === undefined) {
      first.set(request.key, i);
      costs.set(request.key, request.cost);
      return;
    }
    const name = entries[i].name;
    if (requests[j].capacity !== request.capacity || requests[j].refillPerSecond !== request.refillPerSecond) {
      throw new Error(
        `BucketService bucket "${name}" appears twice with different policies in one consumeAll() call: give it one policy`,
      );
    }
    const cost = (costs.get(request.key) as number) + request.cost;
    costs.set(request.key, cost);
    if (cost > request.capacity) {
      throw new Error(
        `BucketService costs of bucket "${name}" add up to ${cost}, more than its capacity ${request.capacity}, in one consumeAll() call`,
      );
    }
  });
}
