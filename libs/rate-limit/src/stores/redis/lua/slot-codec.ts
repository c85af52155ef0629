import { RateLimitError } from '../../../errors/rate-limit.errors.js';
import type { SlotAnswer, SlotRelease, SlotRequest } from '../../slots.js';

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
