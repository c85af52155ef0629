import type { BucketDecision, BucketPolicy, LeaseSettings } from '../rate-limit.interfaces.js';

/**
 * The token-bucket arithmetic in TypeScript, for the memory store and for turning stored token counts
 * into decisions. The Redis scripts (redis/lua/*.lua) hold the same arithmetic in Lua; a shared table of cases
 * runs through both.
 */

/**
 * The largest capacity. Tokens are doubles (in Lua and here): below 2^40 (~1.1e12) a double has at
 * least 12 bits after the binary point, so whole tokens stay exact after any refill — subtracting an
 * integer cost is exact, `floor(tokens)` is the true count, and a refill's rounding is below 1/8192 of
 * a token. At 1e17 a cost of 1 is lost in rounding (1e17 - 1 === 1e17): the bucket never drains.
 */
export const MAX_CAPACITY = 1e12;

/**
 * The longest window B/R, in seconds (about 31,700 years). The script stores the bucket with
 * `PEXPIRE ceil(2 * B / R * 1000)`: at most 2e15 ms, an exact integer in a double (< 2^53), printed as
 * digits by `%d` and far below the 64-bit milliseconds PEXPIRE accepts. Headers (`w=`, reset, retry)
 * are at most this many seconds: safe integers.
 */
export const MAX_WINDOW_SECONDS = 1e12;

/**
 * How far a stored `ts` may be ahead of the clock before it is treated as damage and moved back to now.
 * Within it, a stamp ahead of now is kept (no refill until the clock passes it): a Redis clock that
 * steps back a little (an NTP correction, a failover to a replica whose clock lags by milliseconds)
 * neither refills nor refills the same time twice when it steps forward again. Beyond it, the bucket
 * would be frozen for as long as the stamp is ahead (a stamp an hour ahead: an hour of refusals), so
 * the stamp becomes now: the tokens are kept and refilling starts again from now. Moving the stamp back
 * never adds tokens; it only lets time that passes from now on count.
 */
export const FUTURE_TOLERANCE_MS = 1_000;

/** A bucket as it is stored: fractional tokens at a time in ms. */
export interface BucketState {
  tokens: number;
  ts: number;
  /** The longest wait (ms) of the reservations that took it below 0 (the script's field `w`), if any did. */
  w?: number;
  /** How far below 0 those reservations may take it, in tokens (the script's field `d`), if any did. */
  d?: number;
}

/**
 * How far below 0 reservations (`acquire()`) may have taken a bucket whose stored longest wait is `w`
 * ms: what refills within it, plus one token for rounding; 0 without one; never more than what refills
 * within the longest window (at most MAX_CAPACITY), as for penalties. Tokens above `-reservedFloor` are
 * legal state, below it damage. The script computes the same (`reserved`).
 */
export function reservedFloor(w: number | undefined, refillPerSecond: number, d?: number): number {
  let least = w !== undefined && w > 0 ? (w * refillPerSecond) / 1000 + 1 : 0;
  // The depth in tokens that the reservations stored reads alike for callers of any refill (a rolling deploy).
  if (d !== undefined && d > least) least = d;
  const most = Math.min(MAX_CAPACITY, MAX_WINDOW_SECONDS * refillPerSecond);
  return least <= most ? least : most;
}

/** The depth (tokens) a reservation allowed to wait `boundMs` stores at its refill: what refills meanwhile, plus one. */
export function reservedDepth(boundMs: number, refillPerSecond: number): number {
  return (boundMs * refillPerSecond) / 1000 + 1;
}

/**
 * Whether a refund gives its cost back to a bucket that holds `tokens` after the refill. At or above 0
 * (no turn to come), yes. Below 0 with reservations (`state` has their depth), they wait with turns already told; tokens given back would let
 * new callers share their moments (more than B + R·t in a window), so only the give-back of the last
 * reservation (`givesBack`: no reservation came after it, so the bucket holds what it left plus the refill
 * since, within half a token) gives its cost back, and moves the last turn back by exactly that. The script
 * decides the same (`last`).
 */
export function refundGives(
  tokens: number,
  refillPerSecond: number,
  givesBack: { tokens: number; nowMs: number } | undefined,
  now: number,
  state: BucketState | undefined,
): boolean {
  // Below 0 by a penalty alone (no reservation ever stored its depth), a refund gives back as ever: a
  // penalty only holds a bucket lower than B + R·t would.
  if (tokens >= 0 || !(reservedFloor(state?.w, refillPerSecond, state?.d) > 0)) return true;
  if (givesBack === undefined || !Number.isFinite(givesBack.tokens) || !Number.isFinite(givesBack.nowMs)) return false;
  const since = now > givesBack.nowMs ? now - givesBack.nowMs : 0;
  return tokens >= givesBack.tokens + (since * refillPerSecond) / 1000 - 0.5;
}

/** The wait (ms) until a bucket holding `tokens` has `cost`: what a reservation is told. The script computes the same. */
export function reserveWaitMs(tokens: number, cost: number, refillPerSecond: number): number {
  return tokens < cost ? Math.ceil(((cost - tokens) / refillPerSecond) * 1000) : 0;
}

/** One bucket to be drained as part of a decision. */
export interface BucketRequest extends BucketPolicy {
  /** Full key (store key, with prefix). */
  key: string;
  /** Tokens to take (0 takes nothing). */
  cost: number;
  /**
   * Penalty (`blockSeconds` of the policy): a take this bucket refuses makes it wait at least this many
   * seconds before it allows again. Absent or 0: none.
   */
  blockSeconds?: number;
  /**
   * The cost a penalty gives back after `blockSeconds` (the policy's fixed cost; 1 when the cost is
   * computed per request), so that a penalty never depends on the cost of the request it refused.
   * Default: `cost`.
   */
  penaltyCost?: number;
  /**
   * A priority's floor (the policy's `reserve` for the request's level): tokens a take must leave in the
   * bucket, so it is allowed only when `tokens - floor >= cost`. From 0 to below `capacity`; absent or 0:
   * none. Takes only: a peek (`dryRun`) and a refund ignore it. A floor never starts a penalty: a take
   * refused by its floor alone (the bucket had its cost) writes nothing but a repair.
   */
  floor?: number;
  /**
   * Leased mode (the route policy's `lease`): the decision engine may spend a batch this instance leased
   * instead of asking the store (docs/explanation/leases.md). Stores ignore it.
   */
  lease?: LeaseSettings;
}

/**
 * What a store adds to its answer when a bucket of the call has a penalty: per bucket, the ms its
 * penalty still runs after the store's now (0: none; whole ms rounded down from Redis). The deny cache answers a refusal of a bucket with
 * a penalty only while that penalty is known to run (then the store would write nothing either).
 */
export interface PenaltyReport {
  penaltyMs?: number[];
}

/**
 * State that can be trusted, or undefined for a bucket to treat as missing (full). Non-finite tokens or
 * stamps count as missing; tokens below `-blockSeconds * R` (0 without a penalty) and below the
 * reservations' floor (`reservedFloor` of the stored `w`) as 0, unless a
 * penalty runs (`penaltyRuns`: started by any caller of the bucket, whatever its numbers), which keeps
 * them down to `-min(MAX_CAPACITY, MAX_WINDOW_SECONDS * R)` (what refills within the longest window, so
 * the TTL stays within bounds); a stamp more than `FUTURE_TOLERANCE_MS` ahead of `now` as now. The
 * script does the same in Lua. Answers `state` itself when nothing needed repair.
 */
export function repair<S extends BucketState>(
  state: S | undefined,
  now: number,
  blockSeconds = 0,
  refillPerSecond = 0,
  penaltyRuns = false,
): S | BucketState | undefined {
  if (state === undefined) return undefined;
  const { tokens, ts } = state;
  if (!Number.isFinite(tokens) || !Number.isFinite(ts)) return undefined;
  const lowest = penaltyRuns ? -Math.min(MAX_CAPACITY, MAX_WINDOW_SECONDS * refillPerSecond) : -(blockSeconds * refillPerSecond);
  const legal = tokens >= 0 || !(tokens < lowest) || !(tokens < -reservedFloor(state.w, refillPerSecond, state.d));
  if (legal && ts <= now + FUTURE_TOLERANCE_MS) return state;
  const repaired: BucketState = { tokens: legal ? tokens : 0, ts: ts > now + FUTURE_TOLERANCE_MS ? now : ts };
  if (state.w !== undefined) repaired.w = state.w;
  if (state.d !== undefined) repaired.d = state.d;
  return repaired;
}

/**
 * Tokens a refused take leaves in a bucket with a penalty of `blockSeconds`: `penaltyCost - blockSeconds * R`
 * (negative when the penalty is longer than that cost takes to refill), so that refilling gives it the
 * policy's cost back exactly `blockSeconds` after the refusal, whatever the refused request cost. The
 * script computes the same expression.
 */
export function penaltyTokens(penaltyCost: number, blockSeconds: number, refillPerSecond: number): number {
  return penaltyCost - blockSeconds * refillPerSecond;
}

/** The cost a request's penalty gives back: its `penaltyCost`, else its cost. */
export function penaltyCostOf(request: BucketRequest): number {
  return request.penaltyCost ?? request.cost;
}

/**
 * What a refused take is told while a penalty runs until `end`: never more tokens than leave it its
 * cost exactly when the penalty ends, at its own refill rate (so its Retry-After is the penalty's
 * remaining time, whatever numbers the caller that started it had), and never below -MAX_CAPACITY.
 * The script does the same.
 */
export function shownTokens(tokens: number, cost: number, refillPerSecond: number, end: number | undefined, now: number): number {
  if (end === undefined) return tokens;
  let most = cost - ((end - now) * refillPerSecond) / 1000;
  if (!(most >= -MAX_CAPACITY)) most = -MAX_CAPACITY;
  return most < tokens ? most : tokens;
}

/**
 * How long a written bucket is kept: the idle TTL, or longer for a bucket below 0 tokens (a penalty),
 * so that it cannot expire (and come back full) before it has refilled, and at least while its penalty
 * runs (`penaltyLeftMs`, at most 2 * MAX_WINDOW_SECONDS).
 */
export function storedTtlMs(policy: BucketPolicy, tokens: number, penaltyLeftMs = 0): number {
  let ttl = idleTtlMs(policy);
  if (tokens < 0) {
    const fill = Math.ceil(((policy.capacity - tokens) / policy.refillPerSecond) * 1000);
    if (fill > ttl) ttl = fill;
  }
  if (penaltyLeftMs > ttl) ttl = Math.min(Math.ceil(penaltyLeftMs), 2 * MAX_WINDOW_SECONDS * 1000);
  return ttl;
}

/** Tokens in a bucket at `now`: what it had plus the refill since, never more than a full bucket. */
export function refill(state: BucketState | undefined, policy: BucketPolicy, now: number): number {
  if (state === undefined) return policy.capacity;
  const elapsed = now - state.ts;
  const tokens = elapsed > 0 ? state.tokens + (elapsed * policy.refillPerSecond) / 1000 : state.tokens;
  return tokens > policy.capacity ? policy.capacity : tokens;
}

/**
 * Time stamp to store: never moves backwards (within `FUTURE_TOLERANCE_MS`, see `repair`), so a small
 * clock step back cannot refill the same time twice.
 */
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
export function toDecision(policy: BucketPolicy & { floor?: number }, tokens: number, cost: number, allowed: boolean): BucketDecision {
  // Headers carry these numbers: whatever a store answered, they are integers from 0 to the bounds.
  // Tokens below 0 are a penalty (`blockSeconds`): nothing remains, and the waits count from the real
  // tokens. A penalty withholds at most min(MAX_CAPACITY, MAX_WINDOW_SECONDS * R) tokens (checked at
  // start-up), so every wait stays at most 2 * MAX_WINDOW_SECONDS.
  if (!Number.isFinite(tokens)) tokens = tokens === Infinity ? policy.capacity : 0;
  else if (tokens > policy.capacity) tokens = policy.capacity;
  else if (tokens < 0) {
    const floor = -Math.min(MAX_CAPACITY, MAX_WINDOW_SECONDS * policy.refillPerSecond);
    if (tokens < floor) tokens = floor;
  }
  // A priority's floor: what is left and the wait are those of the request's own level (tokens above its
  // floor; until the bucket holds floor + cost). The reset stays the bucket's (until full).
  const floor = policy.floor !== undefined && policy.floor > 0 && policy.floor < policy.capacity ? policy.floor : 0;
  const above = tokens - floor;
  return {
    allowed,
    limit: policy.capacity,
    remaining: above > 0 ? Math.floor(above) : 0,
    retryAfterSeconds: allowed || above >= cost ? 0 : Math.max(1, secondsUntil(above, cost, policy.refillPerSecond)),
    resetSeconds: secondsUntil(tokens, policy.capacity, policy.refillPerSecond),
  };
}

/** Requests with every key once, and where each original request went. */
export interface MergedRequests {
  requests: BucketRequest[];
  /** `positions[i]`: the index in `requests` of the original request i. */
  positions: number[];
}

/**
 * One atomic call reads each bucket once, so a key named twice would be drained once for two costs.
 * Repeats are merged into one request: the costs summed, and the smaller capacity and refill of the
 * two (never more generous than either), and the longer `blockSeconds`. Undefined when every key is distinct (the usual case).
 */
export function mergeRepeatedKeys(requests: readonly BucketRequest[]): MergedRequests | undefined {
  if (requests.length < 2 || !hasRepeatedKey(requests)) return undefined;
  const merged: BucketRequest[] = [];
  const positions = new Array<number>(requests.length);
  const at = new Map<string, number>();
  requests.forEach((request, i) => {
    const j = at.get(request.key);
    if (j === undefined) {
      at.set(request.key, merged.length);
      positions[i] = merged.length;
      const copy: BucketRequest = {
        key: request.key,
        capacity: request.capacity,
        refillPerSecond: request.refillPerSecond,
        cost: request.cost,
      };
      if (request.blockSeconds) copy.blockSeconds = request.blockSeconds;
      if (request.penaltyCost !== undefined) copy.penaltyCost = request.penaltyCost;
      if (request.floor !== undefined) copy.floor = request.floor;
      merged.push(copy);
      return;
    }
    const into = merged[j];
    // One take of the summed costs: its penalty gives back the summed penalty costs.
    if (into.penaltyCost !== undefined || request.penaltyCost !== undefined)
      into.penaltyCost = penaltyCostOf(into) + penaltyCostOf(request);
    into.cost += request.cost;
    into.capacity = Math.min(into.capacity, request.capacity);
    into.refillPerSecond = Math.min(into.refillPerSecond, request.refillPerSecond);
    // The longer penalty of the two (never more lenient than either).
    if ((request.blockSeconds ?? 0) > (into.blockSeconds ?? 0)) into.blockSeconds = request.blockSeconds;
    // The higher floor of the two, below the smaller capacity.
    const floor = Math.min(Math.max(into.floor ?? 0, request.floor ?? 0), into.capacity - 1);
    if (floor > 0) into.floor = floor;
    else delete into.floor;
    positions[i] = j;
  });
  return { requests: merged, positions };
}

function hasRepeatedKey(requests: readonly BucketRequest[]): boolean {
  for (let i = 1; i < requests.length; i++) {
    for (let j = 0; j < i; j++) if (requests[i].key === requests[j].key) return true;
  }
  return false;
}
