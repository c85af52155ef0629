import {
  type BucketRequest,
  type BucketState,
  type PenaltyReport,
  nextTimestamp,
  penaltyCostOf,
  penaltyTokens,
  refill,
  repair,
  refundGives,
  reservedDepth,
  reserveWaitMs,
  shownTokens,
  storedTtlMs,
} from '../token-bucket.js';
import { ThrottledLogger } from '../../throttled-logger.js';
import type { BucketStore, ReserveOptions, TakeOptions, TakeResult } from '../bucket-store.interface.js';
import { RateLimitConfigError, RateLimitError } from '../../errors/rate-limit.errors.js';
import type { SlotAnswer, SlotCallOptions, SlotRelease, SlotRequest, SlotStore, SlotTakeResult } from '../slots.js';
import { MemorySlots, takeWithSlotIn } from './memory-slots.js';

interface StoredBucket extends BucketState {
  expiresAt: number;
  /** From this time (ms) on the bucket is surely full again: forgetting it changes no decision. */
  fullAt: number;
  /** When its penalty ends (the script's field `b`), if it ever had one. */
  blockedUntil?: number;
}

/** Entries written between two sweeps of expired and full buckets. */
const SWEEP_EVERY = 10_000;

/** The default of `maxBuckets` (and of the module's `maxLocalBuckets`). */
export const DEFAULT_MAX_LOCAL_BUCKETS = 100_000;

export interface MemoryBucketStoreOptions {
  /**
   * The most buckets held at once. A new bucket beyond it first sweeps expired and full buckets (which
   * changes no decision), then forgets the least recently written one (which starts full again). Default 100,000.
   */
  maxBuckets?: number;
  /** Called with the key of each bucket forgotten before it was full (never for expired or full ones). */
  onEvict?: (key: string) => void;
  /** The clock in ms. Default `Date.now`. */
  clock?: () => number;
}

/**
 * Buckets in this process: the same algorithm as the Redis script, for one instance (development,
 * tests, the demo's fallback) and for `failureMode: 'local'`. Memory is bounded by `maxBuckets`.
 */
export class MemoryBucketStore implements BucketStore, SlotStore {
  readonly remote = false;
  /** In the order they were last written: the first is the least recently used. */
  private readonly buckets = new Map<string, StoredBucket>();
  /**
   * Where the least recently written bucket is: an iterator kept from one eviction to the next. A fresh
   * `entries().next()` per eviction walks past every slot the Map's deletes left at its front (V8 compacts
   * them only when it rehashes), which made each new identity of a full store cost a scan of up to a
   * third of it. Everything before the iterator was evicted or moved to the end (written again), so the
   * next entry it yields is the oldest one.
   */
  private oldest: Iterator<[string, StoredBucket]> | undefined;
  private writesSinceSweep = 0;
  private readonly clock: () => number;
  private readonly maxBuckets: number;
  private readonly onEvict: ((key: string) => void) | undefined;
  /** Concurrency slots (`SlotStore`). */
  private readonly slots: MemorySlots;

  constructor(options: MemoryBucketStoreOptions = {}) {
    const maxBuckets = options.maxBuckets ?? DEFAULT_MAX_LOCAL_BUCKETS;
    if (!Number.isSafeInteger(maxBuckets) || maxBuckets < 1) {
      throw new RateLimitConfigError(
        'ERR_RATE_LIMIT_INVALID_OPTION',
        `MemoryBucketStore: maxBuckets must be an integer >= 1 (got ${JSON.stringify(maxBuckets)})`,
      );
    }
    this.maxBuckets = maxBuckets;
    this.clock = options.clock ?? Date.now;
    this.onEvict = options.onEvict;
    this.slots = new MemorySlots(this.clock);
  }

  /** A concurrency slot (`SlotStore`), decided at once: `takeSlotSync` behind a promise. */
  takeSlot(request: SlotRequest, options: SlotCallOptions = {}): Promise<SlotAnswer> {
    try {
      return Promise.resolve(this.slots.take(request, options.now));
    } catch (error) {
      return Promise.reject(error);
    }
  }

  takeSlotSync(request: SlotRequest): SlotAnswer {
    return this.slots.take(request);
  }

  giveBackSlot(key: string, holder: string): Promise<SlotRelease> {
    return Promise.resolve(this.slots.giveBack(key, holder));
  }

  giveBackSlotSync(key: string, holder: string): SlotRelease {
    return this.slots.giveBack(key, holder);
  }

  /** A take and a slot decided together (`SlotStore.takeWithSlot`), at once: `takeWithSlotSync` behind a promise. */
  takeWithSlot(requests: readonly BucketRequest[], slot: SlotRequest, options: Pick<TakeOptions, 'now'> = {}): Promise<SlotTakeResult> {
    try {
      return Promise.resolve(this.takeWithSlotSync(requests, slot, options.now));
    } catch (error) {
      return Promise.reject(error);
    }
  }

  /** The slot is asked for only when the buckets have their cost, and they are drained only when it is held (`takeWithSlotIn`). */
  takeWithSlotSync(requests: readonly BucketRequest[], slot: SlotRequest, now = this.clock()): SlotTakeResult {
    return takeWithSlotIn(this.slots, requests, (options) => this.takeSync(requests, options), slot, now);
  }

  take(requests: readonly BucketRequest[], options: TakeOptions = {}): Promise<TakeResult & PenaltyReport> {
    try {
      return Promise.resolve(this.takeSync(requests, options));
    } catch (error) {
      return Promise.reject(error);
    }
  }

  takeSync(requests: readonly BucketRequest[], options: TakeOptions = {}): TakeResult & PenaltyReport {
    const now = options.now ?? this.clock();
    if (options.reserve !== undefined) return this.reserveSync(requests, options.reserve, now);
    if (requests.length > 1) assertDistinctKeys(requests);
    const penalties = requests.some((request) => (request.blockSeconds ?? 0) > 0);
    const stored = requests.map((request) => this.read(request.key, now));
    // Penalties still running (the script's `b` > now), whichever caller of the bucket started them.
    const ends = stored.map((bucket) => {
      const end = bucket?.blockedUntil;
      return end !== undefined && end > now && end !== Infinity ? end : undefined;
    });
    // Like the script: a stamp too far ahead (the process clock stepped back) is moved to now, tokens
    // below what a penalty can leave to 0.
    const states = stored.map((state, i) =>
      repair(state, now, requests[i].blockSeconds ?? 0, requests[i].refillPerSecond, ends[i] !== undefined),
    );
    const tokens = requests.map((request, i) => refill(states[i], request, now));
    // A running penalty refuses every take, whatever the numbers of the caller; a take's floor (a
    // priority's reserve) must be left after its cost.
    const floors = options.dryRun === true ? undefined : requests.map(floorOf);
    const allowed =
      options.refund === true || requests.every((request, i) => tokens[i] - (floors?.[i] ?? 0) >= request.cost && ends[i] === undefined);
    // What a refused take is told depends on the penalties that ran when it was decided, not on one it starts.
    const running = allowed ? ends : ends.slice();
    const result = (): TakeResult & PenaltyReport => {
      const told = allowed ? tokens : tokens.map((t, i) => shownTokens(t, requests[i].cost, requests[i].refillPerSecond, running[i], now));
      return penalties
        ? { allowed, tokens: told, penaltyMs: ends.map((end) => (end === undefined ? 0 : end - now)) }
        : { allowed, tokens: told };
    };
    if (options.dryRun) return result();
    const givesBack = requests.length === 1 ? options.givesBack : undefined;
    requests.forEach((request, i) => {
      const block = request.blockSeconds ?? 0;
      let blockedUntil = stored[i]?.blockedUntil;
      // A refund into a bucket below 0 gives back only the last reservation (`refundGives`).
      const gives = allowed && !(options.refund === true && !refundGives(tokens[i], request.refillPerSecond, givesBack, now, states[i]));
      if (gives) {
        tokens[i] = options.refund ? Math.min(request.capacity, tokens[i] + request.cost) : tokens[i] - request.cost;
      } else if (!allowed && block > 0 && tokens[i] < request.cost && ends[i] === undefined) {
        // The refusal that starts a penalty: the cost comes back exactly `block` seconds from now.
        const floor = penaltyTokens(penaltyCostOf(request), block, request.refillPerSecond);
        if (floor < tokens[i]) tokens[i] = floor;
        blockedUntil = ends[i] = now + block * 1000;
      } else if (states[i] === stored[i]) {
        return;
      }
      const ts = nextTimestamp(states[i], now);
      const before = stored[i];
      const bucket: StoredBucket = {
        tokens: tokens[i],
        ts,
        // Never sooner than it was: a caller with other numbers (a route sharing the name) may need it longer.
        expiresAt: Math.max(
          now + storedTtlMs(request, tokens[i], ends[i] === undefined ? 0 : ends[i]! - now),
          before?.expiresAt ?? -Infinity,
        ),
        // Refilling from ts; one ms more than the arithmetic says, so that rounding never forgets a bucket short of full.
        fullAt: Math.max(
          Math.max(ts, now) + Math.ceil(((request.capacity - tokens[i]) * 1000) / request.refillPerSecond) + 1,
          before?.fullAt ?? -Infinity,
        ),
      };
      if (blockedUntil !== undefined) bucket.blockedUntil = blockedUntil;
      if (before?.w !== undefined) bucket.w = before.w;
      if (before?.d !== undefined) bucket.d = before.d;
      this.write(request.key, bucket, now);
    });
    return result();
  }

  /**
   * A reservation (`BucketStore` rule 9), as the script makes it: the wait until the bucket holds the
   * cost (and until a running penalty ends); within `maxWaitMs` the cost is taken, below 0 if need be,
   * and the bucket keeps the largest `boundMs` seen as `w`.
   */
  private reserveSync(requests: readonly BucketRequest[], reserve: ReserveOptions, now: number): TakeResult {
    if (requests.length !== 1)
      throw new RateLimitError(
        'ERR_RATE_LIMIT_STORE_CONTRACT',
        `MemoryBucketStore: a reservation is of one bucket (got ${requests.length})`,
      );
    const [request] = requests;
    const stored = this.read(request.key, now);
    const end = stored?.blockedUntil;
    const running = end !== undefined && end > now && end !== Infinity ? end : undefined;
    const state = repair(stored, now, 0, request.refillPerSecond, running !== undefined);
    let tokens = refill(state, request, now);
    let waitMs = reserveWaitMs(tokens, request.cost, request.refillPerSecond);
    if (running !== undefined && running - now > waitMs) waitMs = Math.ceil(running - now);
    const allowed = waitMs <= reserve.maxWaitMs;
    if (!allowed && state === stored) return { allowed, tokens: [tokens], waitMs, nowMs: now };
    if (allowed) tokens -= request.cost;
    const ts = nextTimestamp(state, now);
    const bucket: StoredBucket = {
      tokens,
      ts,
      expiresAt: Math.max(now + storedTtlMs(request, tokens, running === undefined ? 0 : running - now), stored?.expiresAt ?? -Infinity),
      fullAt: Math.max(
        Math.max(ts, now) + Math.ceil(((request.capacity - tokens) * 1000) / request.refillPerSecond) + 1,
        stored?.fullAt ?? -Infinity,
      ),
    };
    if (stored?.blockedUntil !== undefined) bucket.blockedUntil = stored.blockedUntil;
    const { w, d } = stored ?? {};
    const depth = reservedDepth(reserve.boundMs, request.refillPerSecond);
    if (allowed && tokens < 0 && !(w !== undefined && w >= reserve.boundMs)) bucket.w = reserve.boundMs;
    else if (w !== undefined) bucket.w = w;
    if (allowed && tokens < 0 && !(d !== undefined && d >= depth)) bucket.d = depth;
    else if (d !== undefined) bucket.d = d;
    this.write(request.key, bucket, now);
    return { allowed, tokens: [tokens], waitMs, nowMs: now };
  }

  delete(keys: readonly string[]): Promise<void> {
    for (const key of keys) {
      this.buckets.delete(key);
      this.slots.delete(key);
    }
    return Promise.resolve();
  }

  /** Forgets every bucket (the local fallback when Redis answers again: Redis' buckets are the truth). */
  clear(): void {
    this.buckets.clear();
    this.slots.clear();
    this.oldest = undefined;
    this.writesSinceSweep = 0;
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
    // Delete first, so that the Map's order stays the order of last writes.
    if (!this.buckets.delete(key) && this.buckets.size >= this.maxBuckets) this.makeRoom(now);
    this.buckets.set(key, bucket);
    if (++this.writesSinceSweep >= SWEEP_EVERY) this.sweep(now);
  }

  /**
   * Room for one more bucket: sweep when enough writes happened since the last sweep (so a full store
   * does not sweep on every new bucket), then forget the least recently written if still full.
   */
  private makeRoom(now: number): void {
    if (this.writesSinceSweep >= Math.min(SWEEP_EVERY, Math.ceil(this.maxBuckets / 16))) this.sweep(now);
    if (this.buckets.size < this.maxBuckets) return;
    let next = this.oldest?.next();
    if (next === undefined || next.done === true) {
      this.oldest = this.buckets.entries();
      next = this.oldest.next();
    }
    const [key, bucket] = next.value as [string, StoredBucket];
    this.buckets.delete(key);
    if (bucket.expiresAt > now && bucket.fullAt > now) this.onEvict?.(key);
  }

  /** Forgets the buckets that are expired or full again: a missing bucket is a full one. */
  private sweep(now: number): void {
    this.writesSinceSweep = 0;
    for (const [key, bucket] of this.buckets) {
      if (bucket.expiresAt <= now || bucket.fullAt <= now) this.buckets.delete(key);
    }
  }
}

/** The tokens a take must leave in the bucket (`BucketRequest.floor`), checked as the script checks it. */
function floorOf(request: BucketRequest): number {
  const floor = request.floor;
  if (floor === undefined || floor === 0) return 0;
  if (!(floor >= 0 && floor < request.capacity))
    throw new RateLimitError(
      'ERR_RATE_LIMIT_STORE_CONTRACT',
      `MemoryBucketStore: floor must be from 0 to below the capacity (got ${JSON.stringify(floor)} for ${request.key})`,
    );
  return floor;
}

/** One atomic call drains each bucket once: a key given twice would be drained once for two costs. */
function assertDistinctKeys(requests: readonly BucketRequest[]): void {
  const keys = new Set<string>();
  for (const { key } of requests) {
    if (keys.has(key))
      throw new RateLimitError(
        'ERR_RATE_LIMIT_STORE_CONTRACT',
        `MemoryBucketStore: the same key twice in one decision (${key}); merge them first`,
      );
    keys.add(key);
  }
}

/**
 * The module's options for an in-process store: `maxLocalBuckets`, and a warning (at most one per
 * interval) when a bucket is forgotten before it was full, so a limit loosened by the bound is never silent.
 */
export function localStoreOptions(options: { maxLocalBuckets?: number }, what: string): MemoryBucketStoreOptions {
  const maxBuckets = options.maxLocalBuckets ?? DEFAULT_MAX_LOCAL_BUCKETS;
  const evictionLogger = new ThrottledLogger('RateLimit');
  return {
    maxBuckets,
    onEvict: () =>
      evictionLogger.warn(
        `More than ${maxBuckets} buckets are in use in this process (${what}): the least recently used ones ` +
          'are forgotten before they are full and start full again; raise maxLocalBuckets if that is too loose',
      ),
  };
}
