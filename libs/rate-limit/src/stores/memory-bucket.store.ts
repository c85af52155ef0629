import {
  type BucketRequest,
  type BucketState,
  idleTtlMs,
  nextTimestamp,
  refill,
  repair,
} from '../bucket/token-bucket.js';
import type { BucketStore, TakeOptions, TakeResult } from './bucket-store.interface.js';

interface StoredBucket extends BucketState {
  expiresAt: number;
}

/** Entries written between two sweeps of expired buckets; keeps memory bounded by the active buckets. */
const SWEEP_EVERY = 10_000;

/**
 * Buckets in this process: the same algorithm as the Redis script, for one instance (development,
 * tests, the demo's fallback) and for `failureMode: 'local'`.
 */
export class MemoryBucketStore implements BucketStore {
  readonly remote = false;
  private readonly buckets = new Map<string, StoredBucket>();
  private writesSinceSweep = 0;

  constructor(private readonly clock: () => number = Date.now) {}

  take(requests: readonly BucketRequest[], options: TakeOptions = {}): Promise<TakeResult> {
    try {
      return Promise.resolve(this.takeSync(requests, options));
    } catch (error) {
      return Promise.reject(error);
    }
  }

  takeSync(requests: readonly BucketRequest[], options: TakeOptions = {}): TakeResult {
    const now = options.now ?? this.clock();
    if (requests.length > 1) assertDistinctKeys(requests);
    const stored = requests.map((request) => this.read(request.key, now));
    // Like the script: a stamp too far ahead (the process clock stepped back) is moved to now.
    const states = stored.map((state) => repair(state, now));
    const tokens = requests.map((request, i) => refill(states[i], request, now));
    const allowed = options.refund === true || requests.every((request, i) => tokens[i] >= request.cost);
    if (options.dryRun) return { allowed, tokens };
    requests.forEach((request, i) => {
      if (allowed) {
        tokens[i] = options.refund ? Math.min(request.capacity, tokens[i] + request.cost) : tokens[i] - request.cost;
      } else if (states[i] === stored[i]) {
        return;
      }
      this.write(request.key, {
        tokens: tokens[i],
        ts: nextTimestamp(states[i], now),
        expiresAt: now + idleTtlMs(request),
      }, now);
    });
    return { allowed, tokens };
  }

  delete(keys: readonly string[]): Promise<void> {
    for (const key of keys) this.buckets.delete(key);
    return Promise.resolve();
  }

  /** Buckets currently held (expired ones may linger until the next sweep). */
  get size(): number {
    return this.buckets.size;
  }

  private read(key: string, now: number): StoredBucket | undefined {
    const bucket = this.buckets.get(key);
    if (bucket !== undefined && bucket.expiresAt <= now) {
      this.buckets.delete(key);
      return undefined;
    }
    return bucket;
  }

  private write(key: string, bucket: StoredBucket, now: number): void {
    this.buckets.set(key, bucket);
    if (++this.writesSinceSweep >= SWEEP_EVERY) this.sweep(now);
  }

  private sweep(now: number): void {
    this.writesSinceSweep = 0;
    for (const [key, bucket] of this.buckets) {
      if (bucket.expiresAt <= now) this.buckets.delete(key);
    }
  }
}

/** One atomic call drains each bucket once: a key given twice would be drained once for two costs. */
function assertDistinctKeys(requests: readonly BucketRequest[]): void {
  const keys = new Set<string>();
  for (const { key } of requests) {
    if (keys.has(key)) throw new Error(`MemoryBucketStore: the same key twice in one call (${key}); merge them first`);
    keys.add(key);
  }
}
