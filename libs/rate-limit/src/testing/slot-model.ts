import type { SlotRequest } from '../stores/slots.js';

/**
 * The reference model of concurrency slots (`SlotStore`, stores/slots.ts), written from its rules, sharing
 * no code with the stores. Per key, each holder's lease end on the store's clock.
 *
 * What the contract promises, and so what the model answers:
 *
 * - `held` exactly: a take is granted when the holder has a slot (a renewal), or fewer than `limit` other
 *   slots are live. With one limit per key, both say the same: fewer than `limit` live slots of others.
 * - `inFlight` within a range: at least the live slots (a lease ending exactly now has ended), at most
 *   those plus the ended slots not given back since the last take that needed their room. A store may drop
 *   an ended slot any time (the memory store's sweep, a Redis key's TTL); it must drop the ended ones when a
 *   take of a new holder finds `limit` slots in use. The library's stores drop them then only: they answer
 *   `most` (the model's `tightest`).
 * - `waitMs` of a refusal: at most the ms until the earliest lease ends (a poller that sleeps it never
 *   oversleeps a lease's end), 0 when the store cannot tell. The memory store answers that exactly; the
 *   Redis script answers from a bound it keeps (`e`, exact after a scan, more than 0), which a give-back or
 *   a renewal that lengthens a lease leaves lower.
 * - `released`: true for a live slot, false for a holder with none; for an ended slot not yet dropped,
 *   either (the library's stores: true).
 */
export class SlotModel {
  /** Per key, each holder's lease end in ms: ended ones stay until a take needs their room. */
  readonly keys = new Map<string, Map<string, number>>();

  take(request: SlotRequest, now: number): ModelSlotAnswer {
    const { key, limit, holder, leaseMs } = request;
    const slots = this.keys.get(key) ?? new Map<string, number>();
    this.keys.set(key, slots);
    let dropped = 0;
    if (!slots.has(holder) && slots.size >= limit) {
      for (const [other, end] of slots) {
        if (end <= now) {
          slots.delete(other);
          dropped++;
        }
      }
    }
    const renewal = slots.has(holder);
    const held = renewal || slots.size < limit;
    if (held) slots.set(holder, now + leaseMs);
    const ends = [...slots.values()];
    return {
      held,
      inFlight: { least: ends.filter((end) => end > now).length, most: slots.size },
      waitMs: held ? 0 : Math.min(...ends) - now,
      renewal,
      dropped,
    };
  }

  giveBack(key: string, holder: string, now: number): ModelSlotRelease {
    const slots = this.keys.get(key);
    const end = slots?.get(holder);
    slots?.delete(holder);
    if (slots?.size === 0) this.keys.delete(key);
    const ends = [...(slots?.values() ?? [])];
    return {
      released: end === undefined ? false : end > now ? true : 'either',
      tightest: end !== undefined,
      inFlight: { least: ends.filter((e) => e > now).length, most: ends.length },
    };
  }

  /** The holders of `key` the model holds (live or ended), in the order they took their slots. */
  holders(key: string): string[] {
    return [...(this.keys.get(key)?.keys() ?? [])];
  }

  /** When `holder`'s lease of `key` ends; undefined: it holds none. */
  endOf(key: string, holder: string): number | undefined {
    return this.keys.get(key)?.get(holder);
  }
}

/** A range a store's number must be in, both ends included. */
export interface SlotRange {
  least: number;
  most: number;
}

export interface ModelSlotAnswer {
  held: boolean;
  inFlight: SlotRange;
  /** Held: 0. Refused: the most a store may answer, the ms until the earliest lease ends. */
  waitMs: number;
  /** The holder had a slot (live or ended): a renewal. */
  renewal: boolean;
  /** Ended slots this take dropped to make room. */
  dropped: number;
}

export interface ModelSlotRelease {
  released: boolean | 'either';
  /** What the library's stores answer (they keep an ended slot until a take needs its room). */
  tightest: boolean;
  inFlight: SlotRange;
}
