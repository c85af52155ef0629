import type { ReservationMark, ReserveOptions, TakeResult } from '../../bucket-store.interface.js';
import { type BucketRequest, type PenaltyReport, penaltyCostOf } from '../../token-bucket.js';
import { RateLimitError } from '../../../errors/rate-limit.errors.js';
import { DECIDE_SCRIPT, GIVE_BACK_SCRIPT, type LuaScript, RESERVE_SCRIPT } from './lua-scripts.js';

/**
 * The scripts' protocol, from the caller's side: the arguments of each operation (the encoders) and
 * the replies' codes (the decoders). Each script's header (decide.lua, reserve.lua, give-back.lua) is
 * the reference for its part, and test/redis/scripts checks the `--@argv` lines of each header against
 * the encoders here: one change of the protocol touches this folder only.
 */

/** What a decision does to its buckets: decide.lua's modes. */
export type TokenBucketMode = 'take' | 'peek' | 'refund';

/** What the script answers for one decision: the verdict, each bucket's tokens, and penalties still running. */
export type ScriptResult = TakeResult & PenaltyReport;

/** The mode bits of a decision's header (decide.lua). */
export const MODE_CODE: Record<TokenBucketMode, number> = { take: 0, peek: 1, refund: 2 };

/** The mode bits of a take above a floor (decide.lua's mode 3: each bucket carries its `keep` last). */
const TAKE_ABOVE_FLOOR = 3;

/** Adds one decision's header, keys and numbers to a call of decide.lua (see its header). */
export function appendDecision(keys: string[], argv: (string | number)[], requests: readonly BucketRequest[], mode: TokenBucketMode): void {
  const penalty = hasPenalty(requests);
  // Only a take has a floor: a peek and a refund ignore it (BucketRequest.floor).
  const floored = mode === 'take' && hasFloor(requests);
  argv.push(requests.length * 8 + (penalty ? 4 : 0) + (floored ? TAKE_ABOVE_FLOOR : MODE_CODE[mode]));
  for (const request of requests) {
    keys.push(request.key);
    argv.push(request.capacity, request.refillPerSecond, request.cost);
    // Anything but absent or 0 goes to the script, which refuses a blockSeconds out of bounds.
    if (penalty) argv.push(request.blockSeconds ?? 0, penaltyCostOf(request));
    if (floored) argv.push(request.floor ?? 0);
  }
}

/** Whether a bucket of the decision has a floor (`BucketRequest.floor`, a priority's reserve): not the usual call. */
export function hasFloor(requests: readonly BucketRequest[]): boolean {
  // Anything but absent or 0 goes to the script, which refuses a floor out of bounds.
  for (const request of requests) if (request.floor !== undefined && request.floor !== 0) return true;
  return false;
}

export function hasPenalty(requests: readonly BucketRequest[]): boolean {
  // Anything but absent or 0 goes to the script, which refuses a blockSeconds out of bounds.
  for (const request of requests) if (request.blockSeconds !== undefined && request.blockSeconds !== 0) return true;
  return false;
}

/** The tokens a code from a script carries (include/code.lua): exact arithmetic on doubles. */
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

/** One reservation of a batch of one bucket: its cost and the call's longest wait (ms). */
export interface ReserveMember {
  cost: number;
  maxWaitMs: number;
}

/** Adds `members.length` reservations of `request`'s bucket, in order, as one batch of a call of reserve.lua (see its header). */
export function appendReservations(
  keys: string[],
  argv: (string | number)[],
  request: BucketRequest,
  boundMs: number,
  members: readonly ReserveMember[],
): void {
  keys.push(request.key);
  argv.push(members.length, request.capacity, request.refillPerSecond, boundMs);
  for (const member of members) argv.push(member.cost, member.maxWaitMs);
}

/** Adds the give-back of a reservation of `request.cost` that `mark` describes to a call of give-back.lua (see its header). */
export function appendGiveBack(keys: string[], argv: (string | number)[], request: BucketRequest, mark: ReservationMark): void {
  keys.push(request.key);
  argv.push(request.capacity, request.refillPerSecond, request.cost, mark.tokens, mark.nowMs);
}

/**
 * The answers of `n` reservations of one bucket from `reply`, from position `at`: per reservation its
 * bucket's code and its wait, then Redis' now once. Answers them and the position after them.
 */
export function decodeReservations(reply: readonly unknown[], at: number, n: number): { results: TakeResult[]; next: number } {
  const nowMs = reply[at + 2 * n];
  if (typeof nowMs !== 'number' || !Number.isSafeInteger(nowMs)) throw badCode(nowMs);
  const results: TakeResult[] = [];
  for (let j = 0; j < n; j++) {
    const code = reply[at + 2 * j];
    const waitMs = reply[at + 2 * j + 1];
    if (typeof code !== 'number' || !Number.isSafeInteger(code)) throw badCode(code);
    if (typeof waitMs !== 'number' || !Number.isSafeInteger(waitMs) || waitMs < 0) throw badCode(waitMs);
    results.push({ allowed: code % 2 !== 0, tokens: [decodeTokens(code)], waitMs, nowMs });
  }
  return { results, next: at + 2 * n + 1 };
}

/** A call of one reservation alone: its bucket's code, the wait in ms, and Redis' now in ms. */
export function decodeReserve(reply: unknown): TakeResult {
  if (!Array.isArray(reply) || reply.length !== 3)
    throw new RateLimitError(
      'ERR_RATE_LIMIT_STORE_CONTRACT',
      `token-bucket script: expected [code, wait, now], got ${JSON.stringify(reply)}`,
    );
  return decodeReservations(reply, 0, 1).results[0];
}

/** The prefix of the script's refusal of a decision whose key holds another type. */
const UNUSABLE_KEY = 'token-bucket: unusable key';

/**
 * The script's refusal of one decision, as an error: a key that holds another type is that decision's
 * own problem (`ERR_RATE_LIMIT_UNUSABLE_KEY`, never the store failing); a refusal of its numbers is a plain
 * Error, as Redis gives it for a call of one (ioredis' ReplyError, no code).
 */
export function refusalOf(message: string): Error {
  return message.startsWith(UNUSABLE_KEY) ? new RateLimitError('ERR_RATE_LIMIT_UNUSABLE_KEY', message) : new Error(message);
}

/** A call's error: an error reply that refuses an unusable key becomes `ERR_RATE_LIMIT_UNUSABLE_KEY`, anything else stays. */
export function callError(error: unknown): unknown {
  return error instanceof Error && !(error instanceof RateLimitError) && error.message.startsWith(UNUSABLE_KEY)
    ? refusalOf(error.message)
    : error;
}

export function decodeOne(reply: unknown): ScriptResult {
  if (typeof reply !== 'number' || !Number.isSafeInteger(reply)) throw badCode(reply);
  return { allowed: reply % 2 !== 0, tokens: [decodeTokens(reply)] };
}

/** One decision of a script call: buckets taken, peeked or refunded together (decide.lua); reservations of one bucket (reserve.lua); or a give-back (give-back.lua). */
export type ScriptDecision =
  | { kind: 'buckets'; requests: readonly BucketRequest[]; mode: TokenBucketMode }
  | { kind: 'reservations'; request: BucketRequest; boundMs: number; members: readonly ReserveMember[] }
  | { kind: 'giveBack'; request: BucketRequest; mark: ReservationMark };

/** The script that decides each kind of decision. */
export const SCRIPT_OF: Record<ScriptDecision['kind'], LuaScript> = {
  buckets: DECIDE_SCRIPT,
  reservations: RESERVE_SCRIPT,
  giveBack: GIVE_BACK_SCRIPT,
};

/** What a decision of one bucket may add: it reserves (`acquire()`), or it gives a reservation back. */
export interface DecisionExtra {
  reserve?: ReserveOptions;
  givesBack?: ReservationMark;
}

/** A decision as the store holds it: its buckets and mode, and what it adds. */
export interface StoreDecision {
  requests: readonly BucketRequest[];
  mode: TokenBucketMode;
  extra: DecisionExtra | undefined;
}

/** One script call of a turn: its script, its decisions in order, and per decision the positions of the results it answers. */
export interface ScriptCall {
  script: LuaScript;
  decisions: ScriptDecision[];
  owners: number[][];
}

/**
 * The script calls of `decisions`, in order: decisions in a row that one script decides share a call
 * (a turn of takes is one call; a reservation between two takes makes three, so that each is still
 * decided in the order it came). Within a call the reservations of one bucket with the same numbers are
 * one batch (read and written once), at the place of the first, in their order.
 */
export function groupDecisions(decisions: readonly StoreDecision[]): ScriptCall[] {
  const calls: ScriptCall[] = [];
  let current: ScriptCall | undefined;
  let batches = new Map<string, { at: number; members: ReserveMember[] }>();
  decisions.forEach(({ requests, mode, extra }, i) => {
    const reserve = extra?.reserve;
    const decision: ScriptDecision | undefined =
      reserve !== undefined
        ? undefined
        : extra?.givesBack !== undefined
          ? { kind: 'giveBack', request: requests[0], mark: extra.givesBack }
          : { kind: 'buckets', requests, mode };
    const script = reserve !== undefined ? RESERVE_SCRIPT : SCRIPT_OF[decision!.kind];
    if (current === undefined || current.script !== script) {
      current = { script, decisions: [], owners: [] };
      calls.push(current);
      batches = new Map();
    }
    if (reserve !== undefined) {
      const request = requests[0];
      const id = `${request.capacity}/${request.refillPerSecond}/${reserve.boundMs}/${request.key}`;
      const batch = batches.get(id);
      const member = { cost: request.cost, maxWaitMs: reserve.maxWaitMs };
      if (batch !== undefined) {
        batch.members.push(member);
        current.owners[batch.at].push(i);
        return;
      }
      const members = [member];
      batches.set(id, { at: current.decisions.length, members });
      current.decisions.push({ kind: 'reservations', request, boundMs: reserve.boundMs, members });
    } else {
      current.decisions.push(decision!);
    }
    current.owners.push([i]);
  });
  return calls;
}

/** Adds one decision to a call of its script. */
export function appendScriptDecision(keys: string[], argv: (string | number)[], decision: ScriptDecision): void {
  if (decision.kind === 'buckets') appendDecision(keys, argv, decision.requests, decision.mode);
  else if (decision.kind === 'reservations') appendReservations(keys, argv, decision.request, decision.boundMs, decision.members);
  else appendGiveBack(keys, argv, decision.request, decision.mark);
}

/**
 * The reply of a call of one script with `decisions`, in order: one result per decision of buckets or
 * give-back, one per reservation of a batch; or the script's refusal of the decision, once per result it
 * stands for. A call of one decision over one bucket without a penalty (or of one give-back) may be
 * answered by one integer.
 */
export function decodeMany(reply: unknown, decisions: readonly ScriptDecision[]): (ScriptResult | Error)[] {
  if (typeof reply === 'number' && decisions.length === 1 && decisions[0].kind !== 'reservations') {
    const only = decisions[0];
    if (only.kind === 'giveBack' || (only.requests.length === 1 && !hasPenalty(only.requests))) return [decodeOne(reply)];
  }
  if (!Array.isArray(reply))
    throw new RateLimitError('ERR_RATE_LIMIT_STORE_CONTRACT', `token-bucket script: expected an array, got ${JSON.stringify(reply)}`);
  const results: (ScriptResult | Error)[] = [];
  let at = 0;
  for (const decision of decisions) {
    const first: unknown = reply[at];
    if (typeof first === 'string') {
      const refusal = refusalOf(first);
      const count = decision.kind === 'reservations' ? decision.members.length : 1;
      for (let j = 0; j < count; j++) results.push(refusal);
      at += 1;
      continue;
    }
    if (decision.kind === 'reservations') {
      const { results: answers, next } = decodeReservations(reply, at, decision.members.length);
      results.push(...answers);
      at = next;
      continue;
    }
    const requests = decision.kind === 'buckets' ? decision.requests : [decision.request];
    const n = requests.length;
    const tokens = new Array<number>(n);
    for (let i = 0; i < n; i++) {
      const code: unknown = reply[at + i];
      if (typeof code !== 'number' || !Number.isSafeInteger(code)) throw badCode(code);
      tokens[i] = decodeTokens(code);
    }
    const allowed = (first as number) % 2 !== 0;
    at += n;
    if (decision.kind === 'giveBack' || !hasPenalty(requests)) {
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

/** A lease call's numbers (lease.lua): what the holder keeps and gives back of its live lease, and asks for. */
export interface LeaseAsk {
  /** The app instance's id, 1 to 64 characters. */
  holder: string;
  kept: number;
  returned: number;
  want: number;
  lifeMs: number;
}

/** What a lease call answers: the tokens granted, those of the lease the holder keeps, the bucket's tokens after, a penalty's ms. */
export interface LeaseAnswer {
  granted: number;
  kept: number;
  tokens: number;
  penaltyMs: number;
}

/** The keys and arguments of a call of lease.lua (see its header). */
export function appendLease(keys: string[], argv: (string | number)[], request: BucketRequest, ask: LeaseAsk): void {
  keys.push(request.key);
  argv.push(request.capacity, request.refillPerSecond, ask.holder, ask.kept, ask.returned, ask.want, ask.lifeMs);
}

export function decodeLease(reply: unknown): LeaseAnswer {
  if (!Array.isArray(reply) || reply.length !== 4 || !reply.every((value) => typeof value === 'number' && Number.isSafeInteger(value)))
    throw new RateLimitError(
      'ERR_RATE_LIMIT_STORE_CONTRACT',
      `lease script: expected [granted, kept, code, penalty], got ${JSON.stringify(reply)}`,
    );
  const [granted, kept, code, penaltyMs] = reply as number[];
  return { granted, kept, tokens: decodeTokens(code), penaltyMs };
}
