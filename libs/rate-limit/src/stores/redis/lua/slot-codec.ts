import { RateLimitError } from '../../../errors/rate-limit.errors.js';
import type { SlotAnswer, SlotRelease, SlotRequest, SlotTakeResult } from '../../slots.js';
import type { BucketRequest } from '../../token-bucket.js';
import { appendDecision, decodeTokens, hasPenalty } from './script-codec.js';

/** The arguments of a call of slot-take.lua (see its header). */
export function slotTakeArgs(request: SlotRequest, now: number | undefined): (string | number)[] {
  const args: (string | number)[] = [1, request.key, request.limit, request.holder, request.leaseMs];
  if (now !== undefined) args.push(now);
  return args;
}

/** The arguments of a call of slot-give-back.lua. */
export function slotGiveBackArgs(key: string, holder: string): string[] {
  return ['1', key, holder];
}

function integers(reply: unknown, length: number, script: string, shape: string): number[] {
  if (!Array.isArray(reply) || reply.length !== length || !reply.every((value) => typeof value === 'number' && Number.isSafeInteger(value)))
    throw new RateLimitError('ERR_RATE_LIMIT_STORE_CONTRACT', `${script} script: expected ${shape}, got ${JSON.stringify(reply)}`);
  return reply as number[];
}

export function decodeSlotTake(reply: unknown): SlotAnswer {
  const [held, inFlight, waitMs] = integers(reply, 3, 'slot-take', '[held, inFlight, waitMs]');
  return { held: held === 1, inFlight, waitMs };
}

export function decodeSlotGiveBack(reply: unknown): SlotRelease {
  const [released, inFlight] = integers(reply, 2, 'slot-give-back', '[released, inFlight]');
  return { released: released === 1, inFlight };
}

/** The keys and arguments of a call of take-with-slot.lua (see its header): a take's, then the slot's. */
export function takeWithSlotArgs(requests: readonly BucketRequest[], slot: SlotRequest, now: number | undefined): (string | number)[] {
  const keys: string[] = [];
  const argv: (string | number)[] = [];
  appendDecision(keys, argv, requests, 'take');
  keys.push(slot.key);
  argv.push(slot.limit, slot.holder, slot.leaseMs);
  if (now !== undefined) argv.push(now);
  return [keys.length, ...keys, ...argv];
}

/** take-with-slot.lua's reply for `requests`: the buckets' codes (and penalties), then the slot's three numbers. */
export function decodeTakeWithSlot(reply: unknown, requests: readonly BucketRequest[]): SlotTakeResult {
  const n = requests.length;
  const penalty = hasPenalty(requests);
  const values = integers(reply, n * (penalty ? 2 : 1) + 3, 'take-with-slot', '[codes..., (penalties...), held, inFlight, waitMs]');
  const tokens = values.slice(0, n).map(decodeTokens);
  const [got, inFlight, waitMs] = values.slice(values.length - 3);
  const slot: SlotAnswer | undefined = got === -1 ? undefined : { held: got === 1, inFlight, waitMs };
  const result: SlotTakeResult = { allowed: values[0] % 2 !== 0 && slot?.held === true, tokens, slot };
  if (penalty) result.penaltyMs = values.slice(n, 2 * n).map((ms) => (ms > 0 ? ms : 0));
  return result;
}
