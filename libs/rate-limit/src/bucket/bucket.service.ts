import { Inject, Injectable } from '@nestjs/common';
import type { BucketDecision, BucketPolicy } from '../rate-limit.interfaces.js';
import { RATE_LIMIT_OPTIONS } from '../rate-limit.module-definition.js';
import type { ResolvedRateLimitOptions } from '../rate-limit.options.js';
import { serviceKey } from '../keys/identity.js';
import { ThrottledLogger } from '../throttled-logger.js';
import { assertBucketPolicy, assertCost } from '../policies/policy.js';
import { BucketStore, type TakeResult } from '../stores/bucket-store.interface.js';
import { MemoryBucketStore } from '../stores/memory-bucket.store.js';
import { type BucketRequest, toDecision } from './token-bucket.js';
import { withTimeout } from './with-timeout.js';

/** How a verdict was reached. */
export type VerdictSource =
  /** The configured store answered. */
  | 'store'
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

/** The store could not decide and `failureMode` is `'closed'`. */
export class RateLimitUnavailableError extends Error {
  constructor(cause: unknown) {
    super(`rate-limit store unavailable: ${cause instanceof Error ? cause.message : String(cause)}`);
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
  private failing = false;

  constructor(
    @Inject(BucketStore) private readonly store: BucketStore,
    @Inject(RATE_LIMIT_OPTIONS) private readonly options: ResolvedRateLimitOptions,
  ) {}

  /**
   * Takes `cost` tokens from the bucket `name` if it has them. With `failureMode: 'closed'` a store
   * failure throws `RateLimitUnavailableError`; with `'open'` the decision is allowed as if the bucket were full.
   */
  async consume(name: string, policy: BucketPolicy, cost = 1): Promise<BucketDecision> {
    const result = await this.consumeAll([{ name, policy, cost }]);
    return result.decisions[0];
  }

  /** Takes from several buckets atomically: all of them have the tokens and are drained, or none is touched. */
  async consumeAll(entries: readonly BucketEntry[]): Promise<{ allowed: boolean; decisions: BucketDecision[] }> {
    const verdict = await this.decide(entries.map((entry) => this.request(entry, entry.cost ?? 1)));
    if (verdict.source === 'closed') throw new RateLimitUnavailableError('failureMode is closed');
    return { allowed: verdict.allowed, decisions: verdict.decisions };
  }

  /** What `consume(name, policy)` would decide now, without taking a token. */
  async peek(name: string, policy: BucketPolicy): Promise<BucketDecision> {
    const verdict = await this.decide([this.request({ name, policy }, 1)], true);
    if (verdict.source === 'closed') throw new RateLimitUnavailableError('failureMode is closed');
    return verdict.decisions[0];
  }

  /** Makes the bucket `name` full again. */
  async reset(name: string): Promise<void> {
    const keys = [serviceKey(this.options.keyPrefix, name)];
    await this.local.delete(keys);
    const deleted = this.store.delete(keys);
    await (this.store.remote ? withTimeout(deleted, this.options.timeoutMs) : deleted);
  }

  /**
   * One atomic decision over `requests`, never waiting longer than `timeoutMs` for a remote store.
   * When the store fails, `failureMode` decides.
   */
  async decide(requests: readonly BucketRequest[], dryRun = false): Promise<Verdict> {
    const options = dryRun ? { dryRun } : undefined;
    let result: TakeResult;
    let source: VerdictSource = 'store';
    try {
      result = this.store.remote
        ? await withTimeout(this.store.take(requests, options), this.options.timeoutMs)
        : await this.store.take(requests, options);
      if (this.failing) this.recovered();
    } catch (error) {
      this.failed(error);
      source = this.options.failureMode;
      if (source === 'local') {
        result = this.local.takeSync(requests, options);
      } else {
        const allowed = source === 'open';
        return {
          allowed,
          source,
          decisions: requests.map((r) => toDecision(r, allowed ? r.capacity - r.cost : 0, r.cost, allowed)),
        };
      }
    }
    const { allowed, tokens } = result;
    return {
      allowed,
      source,
      decisions: requests.map((r, i) => toDecision(r, tokens[i], r.cost, allowed)),
    };
  }

  private request(entry: BucketEntry, cost: number): BucketRequest {
    const where = `BucketService bucket "${entry.name}"`;
    assertBucketPolicy(entry.policy, where, 'BucketService');
    assertCost(cost, entry.policy.capacity, where, 'BucketService');
    return {
      key: serviceKey(this.options.keyPrefix, entry.name),
      capacity: entry.policy.capacity,
      refillPerSecond: entry.policy.refillPerSecond,
      cost,
    };
  }

  private failed(error: unknown): void {
    this.failing = true;
    this.logger.warn(
      `Rate-limit store failed: ${error instanceof Error ? error.message : String(error)}; ` +
        `failureMode '${this.options.failureMode}' decides until it answers again`,
    );
  }

  private recovered(): void {
    this.failing = false;
    this.logger.rearm();
    this.logger.log('Rate-limit store answers again');
  }
}
