import type { Verdict } from '../rate-limit.interfaces.js';
import type { TakeOptions, TakeResult } from '../stores/bucket-store.interface.js';
import type { CombinedSlotStore, SlotAnswer, SlotRequest, SlotTakeResult } from '../stores/slots.js';
import { type BucketRequest, mergeRepeatedKeys } from '../stores/token-bucket.js';

/** A take and a slot decided together (`DecisionEngine.decideWithSlot`). */
export interface SlotVerdict {
  verdict: Verdict;
  /**
   * The slot's answer; undefined when none was asked for (the buckets refused, or the deny cache did);
   * 'failed' when the store failed and `failureMode` decided the buckets (the caller applies it to the slot).
   */
  slot: SlotAnswer | undefined | 'failed';
}

/**
 * One atomic take of `requests` and one concurrency slot, in one store call (`SlotStore.takeWithSlot`),
 * as `DecisionEngine.decide()` makes a take (`exact`: its `decideExact` with this store call): within `timeoutMs`, through the deny cache and the breakers, `failureMode`
 * deciding the buckets when the store fails. A slot refused leaves the buckets untouched: the verdict
 * is then allowed (the buckets had their cost) with the tokens they hold, and `slot` says the refusal.
 */
export async function takeWithSlot(
  exact: (requests: readonly BucketRequest[], send: (options: TakeOptions | undefined) => Promise<TakeResult>) => Promise<Verdict>,
  guarded: <T>(key: string, call: (sent: () => void) => Promise<T>) => Promise<T>,
  requests: readonly BucketRequest[],
  slot: SlotRequest,
  store: CombinedSlotStore,
): Promise<SlotVerdict> {
  const merged = mergeRepeatedKeys(requests);
  const distinct = merged?.requests ?? requests;
  let answer: SlotAnswer | undefined;
  let pending: Promise<SlotTakeResult> | undefined;
  const verdict = await exact(distinct, (options) =>
    (pending = store.takeWithSlot(distinct, slot, options)).then((result) => {
      answer = result.slot;
      // Not a denial to learn: the buckets had their cost.
      return result.slot?.held === false ? { ...result, allowed: true } : result;
    }),
  );
  const failed = verdict.source !== 'store' && verdict.source !== 'cache';
  if (failed && pending !== undefined) {
    // It timed out, and Redis may still grant the slot: nobody would hold it until its lease ended.
    pending
      .then((late) => (late.slot?.held ? guarded(slot.key, (sent) => store.giveBackSlot(slot.key, slot.holder, { sent })) : undefined))
      .catch(() => undefined);
  }
  const decided = merged === undefined ? verdict : { ...verdict, decisions: merged.positions.map((j) => ({ ...verdict.decisions[j] })) };
  return { verdict: decided, slot: failed ? 'failed' : answer };
}
