import type { BucketDecision, BucketPolicy } from '../rate-limit.interfaces.js';

/**
 * The token-bucket arithmetic in TypeScript, for the memory store and for turning stored token counts
 * into decisions. `token-bucket.script.ts` holds the same arithmetic in Lua; a shared table of cases
 * runs through both.
 */

/** A bucket as it is stored: fractional tokens at a time in ms. */
export interface BucketState {
  tokens: number;
  ts: number;
}

/** One bucket to be drained as part of a decision. */
export interface BucketRequest extends BucketPolicy {
  /** Full key (store key, with prefix). */
  key: string;
  /** Tokens to take (0 takes nothing). */
  cost: number;
}

/** Tokens in a bucket at `now`: what it had plus the refill since, never more than a full bucket. */
export function refill(state: BucketState | undefined, policy: BucketPolicy, now: number): number {
  if (state === undefined) return policy.capacity;
  const elapsed = now - state.ts;
  const tokens = elapsed > 0 ? state.tokens + (elapsed * policy.refillPerSecond) / 1000 : state.tokens;
  return tokens > policy.capacity ? policy.capacity : tokens;
}

/** Time stamp to store: never moves backwards, so a clock step back cannot refill the same time twice. */
export function nextTimestamp(state: BucketState | undefined, now: number): number {
  return state !== undefined && state.ts > now ? state.ts : now;
}

/** How long an idle bucket is kept: twice the time it takes to fill from empty (after that it is full anyway). */
export function idleTtlMs(policy: BucketPolicy): number {
  return Math.ceil(((2 * policy.capacity) / policy.refillPerSecond) * 1000);
}

/** Whole seconds until `tokens` grow to `target` (0 when they are there already). */
function secondsUntil(tokens: number, target: number, refillPerSecond: number): number {
  return tokens >= target ? 0 : Math.ceil((target - tokens) / refillPerSecond);
}

/**
 * The decision one bucket reports, from the tokens it holds after the request.
 * `allowed` is the verdict of the whole request (with several policies a bucket can have had the
 * tokens while another denied). `retryAfterSeconds` is this bucket's wait: 0 when allowed, and 0 too
 * for a bucket that had its tokens when another one refused (it is not what the request waits for);
 * at least 1 for a bucket that refused.
 */
export function toDecision(
  policy: BucketPolicy,
  tokens: number,
  cost: number,
  allowed: boolean,
): BucketDecision {
  return {
    allowed,
    limit: policy.capacity,
    remaining: tokens > 0 ? Math.floor(tokens) : 0,
    retryAfterSeconds: allowed || tokens >= cost ? 0 : Math.max(1, secondsUntil(tokens, cost, policy.refillPerSecond)),
    resetSeconds: secondsUntil(tokens, policy.capacity, policy.refillPerSecond),
  };
}
