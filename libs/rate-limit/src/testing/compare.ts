import { toDecision, type PenaltyReport } from '../stores/token-bucket.js';
import type { TakeResult } from '../stores/bucket-store.interface.js';
import type { ModelOutcome, ModelPolicy, ModelRequest } from './bucket-model.js';
import type { CostPick, FloorPick } from './scenarios.js';

/**
 * How a store's reply is compared with the model's, within the documented tolerances: shared by
 * `verifyBucketStore` and the repository's own model-based test (test/properties/model/).
 */

export class Mismatch extends Error {}

export function fail(message: string, detail: unknown): never {
  throw new Mismatch(`${message}: ${JSON.stringify(detail, (_k, v) => (typeof v === 'number' && !Number.isFinite(v) ? String(v) : v))}`);
}

/** The documented tolerance: 1e-9 relative from one token up, 1e-9 absolute below. */
export function close(actual: number, expected: number): boolean {
  if (!Number.isFinite(expected)) return Object.is(actual, expected) || (Number.isNaN(actual) && Number.isNaN(expected));
  return Math.abs(actual - expected) <= 1e-9 * Math.max(1, Math.abs(expected));
}

/** A penalty's remaining ms: the script replies in whole ms, rounded down (never more than runs). */
export function closeMs(lane: string, actual: number, expected: number): boolean {
  if (!lane.startsWith('lua') && lane !== 'store') return close(actual, expected);
  const slack = 1e-9 * Math.max(1, Math.abs(expected));
  const wholeMs = Number.isInteger(actual) && actual <= expected + slack && actual > expected - 1 - slack;
  // Any other store: exact, or whole ms rounded down as the script replies.
  return wholeMs || (lane === 'store' && close(actual, expected));
}

/**
 * The reply of a store against the model's outcome. `penaltyReportOptional`: a store may leave out
 * `penaltyMs` (the library's stores report it in every call with a penalty, and only then); when given,
 * it must be right.
 */
export function compareResult(
  lane: string,
  step: number,
  result: TakeResult & PenaltyReport,
  expected: ModelOutcome,
  requests: readonly ModelRequest[],
  penaltyReportOptional = false,
): void {
  const detail = () => ({ lane, step, requests, result, expected });
  if (typeof result !== 'object' || result === null || !Array.isArray(result.tokens))
    fail('a reply that is not { allowed, tokens }', detail());
  if (result.allowed !== expected.allowed) fail('allowed differs from the model', detail());
  if (result.tokens.length !== requests.length || !result.tokens.every((t, i) => close(t, expected.tokens[i]))) {
    fail('tokens differ from the model', detail());
  }
  const reported = result.penaltyMs;
  if (penaltyReportOptional && reported === undefined) {
    // Nothing reported: nothing to compare.
  } else if (expected.penaltyMs === undefined) {
    if (reported !== undefined && !(penaltyReportOptional && Array.isArray(reported) && reported.every((ms) => ms === 0))) {
      fail('a penalty report in a call without penalties', detail());
    }
  } else if (
    reported === undefined ||
    reported.length !== requests.length ||
    !reported.every((ms, i) => closeMs(lane, ms, expected.penaltyMs![i]))
  ) {
    fail('penalty report differs from the model', detail());
  }
  requests.forEach((request, i) => {
    const decision = toDecision(request, result.tokens[i], request.cost, result.allowed);
    for (const value of [decision.limit, decision.remaining, decision.retryAfterSeconds, decision.resetSeconds]) {
      if (!Number.isSafeInteger(value) || value < 0) fail('a header value that is not a non-negative integer', { ...detail(), decision });
    }
  });
}

export function resolveCost(pick: CostPick, policy: ModelPolicy, tokensNow: number): number {
  switch (pick.kind) {
    case 'one':
      return 1;
    case 'zero':
      return 0;
    case 'full':
      return policy.capacity;
    case 'over':
      return policy.capacity + 1;
    case 'part':
      return Math.floor(pick.f * policy.capacity);
    case 'edge':
      return Math.min(policy.capacity, Math.max(0, Math.floor(tokensNow) + pick.delta));
  }
}

/**
 * The floor a drawn pick stands for (undefined: none), always from 0 to below the capacity, as a policy's
 * `reserve` makes it: a share of the capacity, or the tokens held now less the cost plus a delta.
 */
export function resolveFloor(pick: FloorPick | undefined, policy: ModelPolicy, tokensNow: number, cost: number): number | undefined {
  if (pick === undefined) return undefined;
  const floor = 'share' in pick ? pick.share * policy.capacity : tokensNow - cost + pick.edge;
  if (!(floor >= 0)) return 0;
  return floor < policy.capacity ? floor : policy.capacity / 2;
}

/**
 * A take allowed above its floors left each bucket at least its floor, but for the rounding of
 * `tokens - floor` in doubles (a few units in the last place of the capacity: a floor of 1e-9 on a full
 * bucket of 1e12 is lost in it, and the store and the model alike take the whole bucket).
 */
export function checkFloors(lane: string, step: number, result: TakeResult, requests: readonly ModelRequest[]): void {
  if (!result.allowed) return;
  requests.forEach((request, i) => {
    const floor = request.floor ?? 0;
    const rounding = 4 * Number.EPSILON * Math.max(1, request.capacity);
    if (floor > 0 && result.tokens[i] < floor - rounding && !close(result.tokens[i], floor))
      fail('a take was admitted below its floor', { lane, step, requests, result });
  });
}
