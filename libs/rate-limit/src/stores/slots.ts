import type { TakeOptions, TakeResult } from './bucket-store.interface.js';
import type { BucketRequest, PenaltyReport } from './token-bucket.js';

/**
 * Concurrency slots (`@ConcurrencyLimit`, `BucketService.takeSlot()`): at most `limit` requests of one
 * identity in flight at once, on every instance. A slot is held from its take until its holder gives it
 * back, or until its lease ends without a renewal (its holder died): see docs/guides/concurrency.md.
 */

/** The most slots one identity may have (a take scans them all when a holder died). */
export const MAX_SLOTS = 10_000;
/** The longest lease of a slot, ms (an hour). */
export const MAX_SLOT_LEASE_MS = 3_600_000;
/** How long a slot is held without a renewal, by default: a holder that died frees its slots after at most this. */
export const DEFAULT_SLOT_LEASE_MS = 30_000;
/** The shortest lease a route or call may ask for: a renewal goes every third of it. */
export const MIN_SLOT_LEASE_MS = 100;
/** The longest wait for a slot. */
export const MAX_SLOT_WAIT_MS = 600_000;
/** The longest holder id. */
export const MAX_HOLDER_LENGTH = 128;

/** One slot asked for, or renewed by the holder that has it. */
export interface SlotRequest {
  /** The identity's slots: one key. */
  key: string;
  /** The most slots in flight at once: an integer from 1 to `MAX_SLOTS`. */
  limit: number;
  /** The holder: one id per request in flight, 1 to 128 characters. */
  holder: string;
  /** How long the slot is held without a renewal (ms, an integer from 1 to `MAX_SLOT_LEASE_MS`). */
  leaseMs: number;
}

/** A take's (or renewal's) answer. */
export interface SlotAnswer {
  /** The holder has the slot now. */
  held: boolean;
  /** The identity's slots in flight after the call, this one included when held (ended ones not yet dropped count: rule 2). */
  inFlight: number;
  /**
   * Refused: at most the ms until the earliest lease of another slot ends (a bound: a give-back frees one
   * sooner; the memory store answers it exactly, the Redis script may answer less). 0 when held.
   */
  waitMs: number;
}

/** A give-back's answer. */
export interface SlotRelease {
  /** The holder's slot was there and is gone; false: it had ended already (its lease ran out, or the key was deleted). */
  released: boolean;
  /** The identity's slots still held. */
  inFlight: number;
}

export interface SlotCallOptions {
  /** Clock override in ms, for tests (takes only). Default: the store's clock (Redis TIME). */
  now?: number;
  /** A remote store calls this when the call is handed to its client, as for `TakeOptions.sent`. */
  sent?: () => void;
}

/** A take of buckets and a slot decided together (`SlotStore.takeWithSlot`). */
export interface SlotTakeResult extends TakeResult, PenaltyReport {
  /**
   * The buckets were drained and the slot is held. False when a bucket lacked its cost (the slot was not
   * asked for: `slot` is undefined) or the slot was refused (then no bucket was touched, and `tokens` are
   * what they hold).
   */
  allowed: boolean;
  /** The slot's answer; undefined when the buckets refused and no slot was asked for. */
  slot: SlotAnswer | undefined;
}

/**
 * A store with concurrency slots. The rules it keeps:
 *
 * 1. A take grants the slot only while fewer than `limit` live slots of the key are held (a slot is live
 *    until its lease ends); taking is atomic, so no two callers get the last slot.
 * 2. A take by a holder that has the slot (live or ended but not yet dropped) renews it: its lease
 *    ends `leaseMs` from now, and nothing else changes.
 * 3. A give-back frees the holder's own slot only; a second one frees nothing.
 * 4. A key with no slot in flight holds nothing for long (Redis: it is deleted or expires with its last lease).
 */
export interface SlotStore {
  takeSlot(request: SlotRequest, options?: SlotCallOptions): Promise<SlotAnswer>;
  giveBackSlot(key: string, holder: string, options?: SlotCallOptions): Promise<SlotRelease>;
  /**
   * Optional: one take of `requests` (a `take()` without options: rules 1, 2 and 4 of `BucketStore`) and
   * one slot, decided together atomically. The slot is asked for only when every bucket has its cost;
   * the buckets are drained only when the slot is held; a slot refused leaves them untouched. A rate
   * refusal writes what `take()`'s would (a penalty). Without it, a route's rate policies and its slot
   * are two calls (a slot refused gives the tokens back).
   */
  takeWithSlot?(
    requests: readonly BucketRequest[],
    slot: SlotRequest,
    options?: Pick<TakeOptions, 'now' | 'sent'>,
  ): Promise<SlotTakeResult>;
}

/** Whether `store` has concurrency slots. */
export function holdsSlots(store: object): store is SlotStore {
  const candidate = store as Partial<SlotStore>;
  return typeof candidate.takeSlot === 'function' && typeof candidate.giveBackSlot === 'function';
}

/** A store that decides a take and a slot in one call. */
export type CombinedSlotStore = SlotStore & Required<Pick<SlotStore, 'takeWithSlot'>>;

/** Whether `store` decides a take and a slot in one call (`SlotStore.takeWithSlot`). */
export function combinesSlots(store: SlotStore): store is CombinedSlotStore {
  return typeof store.takeWithSlot === 'function';
}

/** Why a slot request cannot be sent as it is; undefined when it can. */
export function slotRequestProblem(request: SlotRequest): string | undefined {
  const { limit, holder, leaseMs } = request;
  if (!Number.isInteger(limit) || limit < 1 || limit > MAX_SLOTS) return `the limit must be an integer from 1 to ${MAX_SLOTS}`;
  if (typeof holder !== 'string' || holder.length < 1 || holder.length > MAX_HOLDER_LENGTH) {
    return `the holder must be 1 to ${MAX_HOLDER_LENGTH} characters`;
  }
  if (!Number.isInteger(leaseMs) || leaseMs < 1 || leaseMs > MAX_SLOT_LEASE_MS) {
    return `leaseMs must be an integer from 1 to ${MAX_SLOT_LEASE_MS}`;
  }
  return undefined;
}
