import type { TakeOptions } from '../bucket-store.interface.js';
import type { SlotAnswer, SlotCallOptions, SlotRelease, SlotRequest, SlotTakeResult } from '../slots.js';
import type { BucketRequest } from '../token-bucket.js';
import { type LuaScript, SLOT_GIVE_BACK_SCRIPT, SLOT_TAKE_SCRIPT, TAKE_WITH_SLOT_SCRIPT } from './lua/lua-scripts.js';
import {
  decodeSlotGiveBack,
  decodeSlotTake,
  decodeTakeWithSlot,
  slotGiveBackArgs,
  slotTakeArgs,
  takeWithSlotArgs,
} from './lua/slot-codec.js';
import type { ScriptResult } from './lua/script-codec.js';

/** What the slots need of the store: a script call on a ready connection, its takes, and whether keys share a call. */
export interface SlotCalls {
  /** One script call (rejects at once, saying why, while the connection is not ready). */
  evaluate(script: LuaScript, args: (string | number)[]): Promise<unknown>;
  take(requests: readonly BucketRequest[], options: TakeOptions): Promise<ScriptResult>;
  /** Whether one script call may hold all `keys` (a Cluster: one hash slot). */
  oneCall(keys: readonly string[]): boolean;
}

/**
 * The Redis store's concurrency slots (`SlotStore`): slot-take.lua, slot-give-back.lua, and
 * take-with-slot.lua for a route's rate policies and slot in one call.
 */
export class RedisSlots {
  constructor(private readonly calls: SlotCalls) {}

  take(request: SlotRequest, options: SlotCallOptions): Promise<SlotAnswer> {
    return this.send(SLOT_TAKE_SCRIPT, slotTakeArgs(request, options.now), options.sent).then(decodeSlotTake);
  }

  giveBack(key: string, holder: string, options: SlotCallOptions): Promise<SlotRelease> {
    return this.send(SLOT_GIVE_BACK_SCRIPT, slotGiveBackArgs(key, holder), options.sent).then(decodeSlotGiveBack);
  }

  /**
   * The buckets and the slot in one call of take-with-slot.lua; on a Cluster whose keys are in more than
   * one hash slot (a slot keyed by another identity than the buckets), a take, then the slot, and the
   * take given back when the slot is refused: the same outcome, in up to three calls.
   */
  async takeWith(
    requests: readonly BucketRequest[],
    slot: SlotRequest,
    options: Pick<TakeOptions, 'now' | 'sent'>,
  ): Promise<SlotTakeResult> {
    const keys = requests.map((request) => request.key);
    keys.push(slot.key);
    if (this.calls.oneCall(keys)) {
      const reply = await this.send(TAKE_WITH_SLOT_SCRIPT, takeWithSlotArgs(requests, slot, options.now), options.sent);
      return decodeTakeWithSlot(reply, requests);
    }
    const taken = await this.calls.take(requests, options);
    if (!taken.allowed) return { ...taken, slot: undefined };
    const answer = await this.take(slot, { now: options.now });
    if (answer.held) return { ...taken, slot: answer };
    const back = await this.calls.take(requests, { refund: true, now: options.now });
    return { allowed: false, tokens: back.tokens, slot: answer };
  }

  private send(script: LuaScript, args: (string | number)[], sent: (() => void) | undefined): Promise<unknown> {
    sent?.();
    return this.calls.evaluate(script, args);
  }
}
