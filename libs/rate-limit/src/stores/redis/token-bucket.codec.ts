import type { ReserveOptions, TakeResult } from '../bucket-store.interface.js';
import { type BucketRequest, type PenaltyReport, penaltyCostOf } from '../token-bucket.js';
import type { TokenBucketMode } from './token-bucket.script.js';
import { RateLimitError } from '../../errors/rate-limit.errors.js';

/**
 * The token-bucket script's protocol, from the caller's side: the arguments of a decision (the
 * encoder) and the reply's codes (the decoder). The script's header comment (token-bucket.script.ts)
 * is the reference for both: one change of the protocol touches this folder only.
 */

/** What the script answers for one decision: the verdict, each bucket's tokens, and penalties still running. */
export type ScriptResult = TakeResult & PenaltyReport;

/** The mode bits of a decision's header. */
export const MODE_CODE: Record<TokenBucketMode, number> = { take: 0, peek: 1, refund: 2 };

/** Adds one decision's header, keys and numbers to a call (see the script's header comment). */
export function appendDecision(keys: string[], argv: (string | number)[], requests: readonly BucketRequest[], mode: TokenBucketMode): void {
  const penalty = hasPenalty(requests);
  argv.push(requests.length * 8 + (penalty ? 4 : 0) + MODE_CODE[mode]);
  for (const request of requests) {
    keys.push(request.key);
    argv.push(request.capacity, request.refillPerSecond, request.cost);
    // Anything but absent or 0 goes to the script, which refuses a blockSeconds out of bounds.
    if (penalty) argv.push(request.blockSeconds ?? 0, penaltyCostOf(request));
  }
}

export function hasPenalty(requests: readonly BucketRequest[]): boolean {
  // Anything but absent or 0 goes to the script, which refuses a blockSeconds out of bounds.
  for (const request of requests) if (request.blockSeconds !== undefined && request.blockSeconds !== 0) return true;
  return false;
}

/** The tokens a code from the script carries (see its header comment): exact arithmetic on doubles. */
export function decodeTokens(code: number): number {
  const v = (code % 2 !== 0 ? code - 1 : code) / 2;
  const biased = ((v % 128) + 128) % 128;
  return ((v - biased) / 128) * 2 ** (biased - 64 - 45);
}

/**
 * The tokens a bucket reports from Redis when it holds `tokens`: rounded down to 45 significant bits
 * (and to a multiple of 2^-105 below 2^-61), as the script's code carries them. Written here
 * independently of the Lua, for tests and for anyone who compares the two stores.
 */
export function reportedTokens(tokens: number): number {
  if (tokens === 0) return 0;
  if (!Number.isFinite(tokens)) return tokens;
  let e = Math.floor(Math.log2(Math.abs(tokens))) + 1;
  if (2 ** (e - 1) > Math.abs(tokens)) e -= 1;
  else if (2 ** e <= Math.abs(tokens)) e += 1;
  if (e < -60) e = -60;
  return Math.floor(tokens * 2 ** (45 - e)) * 2 ** (e - 45);
}

function badCode(value: unknown): RateLimitError {
  return new RateLimitError('ERR_RATE_LIMIT_STORE_CONTRACT', `token-bucket script: expected an integer code, got ${JSON.stringify(value)}`);
}

/** The header of a reservation (acquire) of one bucket. */
export const RESERVE_HEADER = 11;

/** The keys and arguments of a call that reserves `request`'s cost (see the script's header comment). */
export function reserveArguments(request: BucketRequest, reserve: ReserveOptions, now: number | undefined): (string | number)[] {
  const args = [
    1,
    request.key,
    RESERVE_HEADER,
    request.capacity,
    request.refillPerSecond,
    request.cost,
    reserve.maxWaitMs,
    reserve.boundMs,
  ];
  if (now !== undefined) args.push(now);
  return args;
}

/** A reservation's reply: its bucket's code, the wait in ms, and Redis' now in ms. */
export function decodeReserve(reply: unknown): TakeResult {
  if (!Array.isArray(reply) || reply.length !== 3)
    throw new RateLimitError(
      'ERR_RATE_LIMIT_STORE_CONTRACT',
      `token-bucket script: expected [code, wait, now], got ${JSON.stringify(reply)}`,
    );
  const [code, waitMs, nowMs] = reply as unknown[];
  if (typeof code !== 'number' || !Number.isSafeInteger(code)) throw badCode(code);
  if (typeof waitMs !== 'number' || !Number.isSafeInteger(waitMs) || waitMs < 0) throw badCode(waitMs);
  if (typeof nowMs !== 'number' || !Number.isSafeInteger(nowMs)) throw badCode(nowMs);
  return { allowed: code % 2 !== 0, tokens: [decodeTokens(code)], waitMs, nowMs };
}

export function decodeOne(reply: unknown): ScriptResult {
  if (typeof reply !== 'number' || !Number.isSafeInteger(reply)) throw badCode(reply);
  return { allowed: reply % 2 !== 0, tokens: [decodeTokens(reply)] };
}

/** The array reply of a call with several buckets or decisions: one result, or the script's refusal, per decision. */
export function decodeMany(reply: unknown, decisions: readonly (readonly BucketRequest[])[]): (ScriptResult | Error)[] {
  if (!Array.isArray(reply))
    throw new RateLimitError('ERR_RATE_LIMIT_STORE_CONTRACT', `token-bucket script: expected an array, got ${JSON.stringify(reply)}`);
  const results: (ScriptResult | Error)[] = [];
  let at = 0;
  for (const requests of decisions) {
    const first = reply[at];
    if (typeof first === 'string') {
      // The script's own refusal of this decision, as Redis gives it for a call of one (ioredis' ReplyError, no code): not a library error.
      results.push(new Error(first));
      at += 1;
      continue;
    }
    const n = requests.length;
    const tokens = new Array<number>(n);
    for (let i = 0; i < n; i++) {
      const code: unknown = reply[at + i];
      if (typeof code !== 'number' || !Number.isSafeInteger(code)) throw badCode(code);
      tokens[i] = decodeTokens(code);
    }
    const allowed = (first as number) % 2 !== 0;
    at += n;
    if (!hasPenalty(requests)) {
      results.push({ allowed, tokens });
      continue;
    }
    const penaltyMs = new Array<number>(n);
    for (let i = 0; i < n; i++) {
      const value = Number(reply[at + i]);
      penaltyMs[i] = Number.isFinite(value) && value > 0 ? value : 0;
    }
    at += n;
    results.push({ allowed, tokens, penaltyMs });
  }
  if (at !== reply.length)
    throw new RateLimitError('ERR_RATE_LIMIT_STORE_CONTRACT', `token-bucket script: expected ${at} values, got ${reply.length}`);
  return results;
}
