import {
  type BucketRequest,
  type BucketState,
  type PenaltyReport,
  nextTimestamp,
  penaltyTokens,
  refill,
  repair,
  storedTtlMs,
} from '../bucket/token-bucket.js';
import type { BucketStore, TakeOptions, TakeResult } from './bucket-store.interface.js';

interface StoredBucket extends BucketState {
  expiresAt: number;
  /** When its penalty ends (the script's field `b`), if it ever had one. */
  blockedUntil?: number;
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

  take(requests: readonly BucketRequest[], options: TakeOptions = {}): Promise<TakeResult & PenaltyReport> {
    try {
      return Promise.resolve(this.takeSync(requests, options));
    } catch (error) {
      return Promise.reject(error);
    }
  }

  takeSync(requests: readonly BucketRequest[], options: TakeOptions = {}): TakeResult & PenaltyReport {
    const now = options.now ?? this.clock();
    if (requests.length > 1) assertDistinctKeys(requests);
    const penalties = requests.some((request) => (request.blockSeconds ?? 0) > 0);
    const stored = requests.map((request) => this.read(request.key, now));
    // Like the script: a stamp too far ahead (the process clock stepped back) is moved to now, tokens
    // below what a penalty can leave to 0.
    const states = stored.map((state, i) =>
      repair(state, now, penalties ? (requests[i].blockSeconds ?? 0) : 0, requests[i].refillPerSecond),
    );
    const tokens = requests.map((request, i) => refill(states[i], request, now));
    // Penalties still running (the script's `b` > now), only read when the call has penalties.
    const ends = requests.map((_, i) => {
      const end = penalties ? stored[i]?.blockedUntil : undefined;
      return end !== undefined && end > now ? end : undefined;
    });
    const allowed = options.refund === true || requests.every((request, i) => tokens[i] >= request.cost);
    const result = (): TakeResult & PenaltyReport =>
      penalties ? { allowed, tokens, penaltyMs: ends.map((end) => (end === undefined ? 0 : end - now)) } : { allowed, tokens };
    if (options.dryRun) return result();
    requests.forEach((request, i) => {
      const block = request.blockSeconds ?? 0;
      let blockedUntil = stored[i]?.blockedUntil;
      if (allowed) {
        tokens[i] = options.refund ? Math.min(request.capacity, tokens[i] + request.cost) : tokens[i] - request.cost;
      } else if (block > 0 && tokens[i] < request.cost && ends[i] === undefined) {
        // The refusal that starts a penalty: the cost comes back exactly `block` seconds from now.
        const floor = penaltyTokens(request.cost, block, request.refillPerSecond);
        if (floor < tokens[i]) tokens[i] = floor;
        blockedUntil = ends[i] = now + block * 1000;
      } else if (states[i] === stored[i]) {
        return;
      }
      const bucket: StoredBucket = {
        tokens: tokens[i],
        ts: nextTimestamp(states[i], now),
        expiresAt: now + storedTtlMs(request, tokens[i]),
      };
      if (blockedUntil !== undefined) bucket.blockedUntil = blockedUntil;
      this.write(request.key, bucket, now);
    });
    return result();
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
