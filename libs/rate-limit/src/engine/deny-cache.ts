import { performance } from 'node:perf_hooks';
import { DENY_CACHE_MAX_ENTRIES } from '../rate-limit.constants.js';
import type { TakeResult } from '../stores/bucket-store.interface.js';
import type { BucketRequest, PenaltyReport } from '../stores/token-bucket.js';

/**
 * Redis counts time in whole milliseconds (TIME, truncated), so between two decisions it can credit up
 * to 1 ms more refill than really passed; every bound below allows for it.
 */
const CLOCK_SLACK_MS = 1;
/** Relative margin for the rounding of Redis' and this file's floating-point arithmetic (both ~1e-16). */
const ROUNDING_MARGIN = 1e-12;

/** What is known about one bucket: from `until` on it may be full again; before, it holds at most `capacity - (until - t) * R`. */
interface Entry {
  until: number;
  capacity: number;
  refillPerSecond: number;
  /**
   * The penalty of the policy it was learned under (0: none). Part of the policy: a call without a
   * penalty repairs the negative tokens one with a penalty leaves, so an entry answers only its own.
   */
  blockSeconds: number;
  /** Until when (this process' clock) a penalty the store reported surely runs; 0: none known. */
  penaltyUntil: number;
}

/**
 * Buckets Redis has recently denied, so this instance can deny them again without a round trip.
 *
 * A bucket gains tokens only by refilling, at most R per second from what Redis last returned, counted
 * from when that request was sent (Redis computed its answer later, so this over-estimates). While even
 * that upper bound cannot cover a request's cost, Redis would deny the request too, and nothing in Redis
 * changes when it denies: answering it here is the same decision. Exact for any cost, per bucket.
 *
 * It cannot see tokens that appear any other way: `reset()` on another instance, a key deleted or
 * evicted in Redis, or one bucket used with different policies by different callers. Those are denied
 * here at most until the bucket could have refilled, never longer.
 *
 * Penalties (`blockSeconds`): the store penalises a bucket that refuses a take unless a penalty already
 * runs on it, and then writes nothing. So a request with a bucket that has a penalty is denied here only
 * while that bucket's penalty is known to run (the store reports how long it still runs); otherwise the
 * store is asked, and starts the penalty. A bucket whose penalty runs holds below its cost until the
 * penalty ends, so the tokens bound covers it: the whole penalty is answered here.
 *
 * Bounded: at most `maxEntries` buckets (the oldest entry goes first), and an entry is dropped as soon as
 * its bucket may be full.
 */
export class DenyCache {
  private readonly entries = new Map<string, Entry>();
  /**
   * When each recently reset bucket was forgotten (this process' clock), oldest first: an answer to a
   * request sent before that is about the bucket before the reset, and is not learned.
   */
  private readonly resets = new Map<string, number>();

  constructor(
    private readonly maxEntries = DENY_CACHE_MAX_ENTRIES,
    /** A monotonic clock in ms; tests pass their own. */
    readonly now: () => number = () => performance.now(),
    /**
     * How long a reset is remembered, in ms: longer than any answer can take to arrive (answers come
     * within `timeoutMs`, or are dropped), with room for a late timer.
     */
    private readonly resetMemoryMs = 60_000,
  ) {}

  /** Buckets currently remembered. */
  get size(): number {
    return this.entries.size;
  }

  /**
   * The most tokens each bucket of `requests` can hold at `now`, when every bucket is known here and at
   * least one of them cannot cover its cost (the request is denied); otherwise `undefined` (ask the store).
   */
  deny(requests: readonly BucketRequest[], now: number): number[] | undefined {
    if (this.entries.size === 0) return undefined;
    let short = false;
    const tokens = new Array<number>(requests.length);
    for (let i = 0; i < requests.length; i++) {
      const request = requests[i];
      const entry = this.entries.get(request.key);
      if (entry === undefined) return undefined;
      if (now >= entry.until || entry.capacity !== request.capacity || entry.refillPerSecond !== request.refillPerSecond) {
        this.entries.delete(request.key);
        return undefined;
      }
      // Learned with another penalty: its bound does not hold for this request (ask the store; the entry stays).
      if (entry.blockSeconds !== (request.blockSeconds ?? 0)) return undefined;
      // The store would penalise this bucket if it lacks its cost now, unless a penalty already runs.
      if (request.blockSeconds !== undefined && request.blockSeconds > 0 && !(now < entry.penaltyUntil)) return undefined;
      const most = entry.capacity - ((entry.until - now) * entry.refillPerSecond) / 1000;
      tokens[i] = most;
      if (most + entry.capacity * ROUNDING_MARGIN < request.cost) short = true;
    }
    return short ? tokens : undefined;
  }

  /**
   * Learns from the store's answer to `requests`, sent at `sentAt`. A denial is remembered for every
   * bucket of the request; an allowance only tightens what is already remembered (the allowed path
   * stays free of writes).
   */
  learn(requests: readonly BucketRequest[], result: TakeResult & PenaltyReport, sentAt: number): void {
    if (result.allowed && this.entries.size === 0) return;
    const penaltyMs = result.penaltyMs;
    for (let i = 0; i < requests.length; i++) {
      const request = requests[i];
      // Sent before this instance reset the bucket: the answer describes the bucket before the reset.
      if (this.resets.size > 0 && this.resetSince(request.key, sentAt)) continue;
      const { capacity, refillPerSecond } = request;
      const blockSeconds = request.blockSeconds ?? 0;
      // Without a penalty of its own, a bucket below -capacity is so by another caller's penalty (or a
      // deep queue of reservations): when that penalty ends, the store repairs the tokens to 0 instead of
      // refilling them from there, so a bound from the told tokens would deny long after the store
      // allows. Counting from -capacity instead only answers less here (asks the store sooner).
      const tokens = blockSeconds > 0 ? result.tokens[i] : Math.max(result.tokens[i], -capacity);
      if (!(tokens < capacity)) {
        // A full bucket: nothing to bound.
        this.entries.delete(request.key);
        continue;
      }
      const until = sentAt - CLOCK_SLACK_MS + ((capacity - tokens) * 1000) / refillPerSecond;
      // The store saw its clock at sentAt or later (whole ms): the penalty runs at least this long here.
      const ms = penaltyMs?.[i];
      const penaltyUntil = ms !== undefined && ms > 0 ? sentAt - CLOCK_SLACK_MS + ms : 0;
      const known = this.entries.get(request.key);
      if (known === undefined) {
        if (result.allowed) continue;
        if (this.entries.size >= this.maxEntries) this.evictOldest();
        this.entries.set(request.key, { until, capacity, refillPerSecond, blockSeconds, penaltyUntil });
      } else if (known.capacity !== capacity || known.refillPerSecond !== refillPerSecond || known.blockSeconds !== blockSeconds) {
        this.entries.set(request.key, {
          until,
          capacity,
          refillPerSecond,
          blockSeconds,
          penaltyUntil: Math.max(penaltyUntil, known.penaltyUntil),
        });
      } else {
        // Same policy: the bound that reaches a full bucket later is the lower one at every moment.
        if (until > known.until) known.until = until;
        // A penalty end only moves later (a new penalty starts after the last one ended).
        if (penaltyUntil > known.penaltyUntil) known.penaltyUntil = penaltyUntil;
      }
    }
  }

  /**
   * Forgets a bucket (its `reset()` on this instance). Answers to requests sent before now are about the
   * bucket before the reset: `learn()` ignores them for this bucket, however late they arrive.
   */
  forget(key: string): void {
    this.entries.delete(key);
    const now = this.now();
    // Oldest first: delete before set, then drop the ones no answer can still be on its way for.
    this.resets.delete(key);
    for (const [old, at] of this.resets) {
      if (at > now - this.resetMemoryMs && this.resets.size < this.maxEntries) break;
      this.resets.delete(old);
    }
    this.resets.set(key, now);
  }

  /** Whether `key` was reset at or after `sentAt`. */
  private resetSince(key: string, sentAt: number): boolean {
    const at = this.resets.get(key);
    return at !== undefined && at >= sentAt;
  }

  private evictOldest(): void {
    const oldest = this.entries.keys().next();
    if (!oldest.done) this.entries.delete(oldest.value);
  }
}
