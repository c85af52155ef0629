import { RateLimitError } from '../../errors/rate-limit.errors.js';
import type { TakeOptions, TakeResult } from '../bucket-store.interface.js';
import { type SlotAnswer, type SlotRelease, type SlotRequest, type SlotTakeResult, slotRequestProblem } from '../slots.js';
import type { BucketRequest, PenaltyReport } from '../token-bucket.js';

/** Keys held before a take sweeps the keys whose slots have all ended. */
const SWEEP_AT = 10_000;

/**
 * Concurrency slots in this process: the rules of slot-take.lua and slot-give-back.lua (`SlotStore`),
 * for the memory store and `failureMode: 'local'`. Per key, each holder's lease end.
 */
export class MemorySlots {
  private readonly keys = new Map<string, Map<string, number>>();

  constructor(private readonly clock: () => number) {}

  take(request: SlotRequest, now = this.clock()): SlotAnswer {
    const problem = slotRequestProblem(request);
    if (problem !== undefined) throw new RateLimitError('ERR_RATE_LIMIT_STORE_CONTRACT', `MemoryBucketStore: ${problem}`);
    const { key, limit, holder, leaseMs } = request;
    let slots = this.keys.get(key);
    const ends = now + leaseMs;
    if (slots?.has(holder)) {
      slots.set(holder, ends);
      return { held: true, inFlight: slots.size, waitMs: 0 };
    }
    if (slots === undefined) {
      if (this.keys.size >= SWEEP_AT) this.sweep(now);
      this.keys.set(key, (slots = new Map()));
    }
    let earliest = Infinity;
    if (slots.size >= limit) {
      for (const [other, until] of slots) {
        if (until <= now) slots.delete(other);
        else if (until < earliest) earliest = until;
      }
    }
    if (slots.size >= limit) return { held: false, inFlight: slots.size, waitMs: earliest === Infinity ? 0 : earliest - now };
    slots.set(holder, ends);
    return { held: true, inFlight: slots.size, waitMs: 0 };
  }

  giveBack(key: string, holder: string): SlotRelease {
    const slots = this.keys.get(key);
    if (slots === undefined || !slots.delete(holder)) return { released: false, inFlight: slots?.size ?? 0 };
    if (slots.size === 0) this.keys.delete(key);
    return { released: true, inFlight: slots.size };
  }

  delete(key: string): void {
    this.keys.delete(key);
  }

  clear(): void {
    this.keys.clear();
  }

  /** Keys with a slot in flight (ended leases may linger until a take or a sweep drops them). */
  get size(): number {
    return this.keys.size;
  }

  /** Drops the slots whose lease ended, and the keys left without any. */
  private sweep(now: number): void {
    for (const [key, slots] of this.keys) {
      for (const [holder, until] of slots) if (until <= now) slots.delete(holder);
      if (slots.size === 0) this.keys.delete(key);
    }
  }
}

/**
 * A take and a slot decided together in this process (`SlotStore.takeWithSlot`): the buckets peeked (a
 * peek ignores floors, so each must keep its floor after its cost, as a take's), the slot taken only
 * when they have their cost, and the take made only when the slot is held. `take` is the store's
 * `takeSync` over `requests`.
 */
export function takeWithSlotIn(
  slots: MemorySlots,
  requests: readonly BucketRequest[],
  take: (options: TakeOptions) => TakeResult & PenaltyReport,
  slot: SlotRequest,
  now: number,
): SlotTakeResult {
  const problem = slotRequestProblem(slot);
  if (problem !== undefined) throw new RateLimitError('ERR_RATE_LIMIT_STORE_CONTRACT', `MemoryBucketStore: ${problem}`);
  const peek = take({ dryRun: true, now });
  const room = peek.allowed && requests.every((request, i) => peek.tokens[i] - (request.floor ?? 0) >= request.cost);
  if (!room) return { ...take({ now }), slot: undefined };
  const answer = slots.take(slot, now);
  if (!answer.held) return { ...peek, allowed: false, slot: answer };
  return { ...take({ now }), slot: answer };
}
