import { RateLimitError } from '../errors/rate-limit.errors.js';
/**
 * A reference model of the token bucket, written from DESIGN.md ("The algorithm") and the README
 * ("The algorithm": bounds, one bucket per key per call, state it does not trust, clocks; "Penalties
 * (`blockSeconds`)"). It imports nothing from the library on purpose: the property test (test/properties/model/, and
 * `verifyBucketStore` for any store) compares the Lua script, the memory store and other stores with it,
 * so it must not share their code.
 *
 * Time is the store's clock in ms (Redis TIME, or the test-only `now`). A stored bucket is kept field by
 * field as raw numbers, so that the test can write damage into it (NaN for text, ±Infinity, negative
 * tokens, stamps in the future); `expiresAt` is the key's TTL on the same clock (undefined: no TTL).
 */

/** A stamp may be this far ahead of now before it counts as damage (README: "more than 1 s ahead"). */
export const MODEL_FUTURE_TOLERANCE_MS = 1000;

export interface ModelPolicy {
  capacity: number;
  refillPerSecond: number;
  /** Penalty in seconds; undefined: none. */
  blockSeconds?: number;
  /** The cost a penalty gives back after blockSeconds (README: the policy's cost); undefined: the request's cost. */
  penaltyCost?: number;
}

export interface ModelRequest extends ModelPolicy {
  key: string;
  cost: number;
  /**
   * A priority's floor (docs/guides/priorities.md): tokens a take must leave in the bucket after its cost;
   * undefined or 0: none. A peek and a refund ignore it.
   */
  floor?: number;
}

/** A stored hash: each field may be absent (undefined) or hold anything that was written there. */
export interface ModelEntry {
  tokens?: number;
  ts?: number;
  /** When a penalty ends (the hash field `b`), in ms. */
  b?: number;
  /** The longest wait (ms) of the reservations that took the bucket below 0 (the hash field `w`). */
  w?: number;
  /** How deep (tokens) those reservations may take it, at the refill of the one that wrote it (the hash field `d`). */
  d?: number;
  /** When the key expires, in ms on the store's clock; undefined: the key has no TTL. */
  expiresAt?: number;
}

export type ModelMode = 'take' | 'peek' | 'refund';

export interface ModelOutcome {
  allowed: boolean;
  /** Tokens of each bucket after the decision. */
  tokens: number[];
  /** Present when a bucket of the call has a penalty: ms each bucket's penalty still runs after now. */
  penaltyMs?: number[];
  /** Per bucket: the TTL in ms this call asked for (never shortening the key's), or undefined when it asked none. */
  ttlSet: (number | undefined)[];
  /** Per bucket: whether this call wrote the hash (tokens and ts). */
  written: boolean[];
  /** Per bucket: whether a penalty ran when the call was decided (then `tokens` is what a refused take is told). */
  running: boolean[];
}

const finite = (x: number | undefined): x is number => typeof x === 'number' && Number.isFinite(x);

/**
 * How far below 0 reservations may have taken a bucket that keeps the longest wait `w` (README: waiting
 * for a token): what refills within `w` ms, plus one token; 0 without a positive `w`; never more than
 * min(1e12, 1e12 s × R), as for a running penalty.
 */
export function modelReservedFloor(w: number | undefined, refillPerSecond: number, d?: number): number {
  const fromWait = typeof w === 'number' && w > 0 ? (w * refillPerSecond) / 1000 + 1 : 0;
  // The stored depth holds for every caller, whatever its own refill (README: a rolling deploy).
  const least = typeof d === 'number' && d > fromWait ? d : fromWait;
  const most = Math.min(1e12, 1e12 * refillPerSecond);
  return least <= most ? least : most;
}

/** A reservation as its answer told it: what a give-back names. */
export interface ModelMark {
  tokens: number;
  nowMs: number;
}

/**
 * Whether a refund gives its cost back to a bucket at `t` tokens (refilled): always at or above 0, and
 * below 0 by a penalty alone; below 0 with reservations (a stored `w` or `d`) only for the give-back of the reservation that is still the last one: the bucket
 * holds what it left plus what refilled since, give or take half a token.
 */
export function modelRefundGives(
  t: number,
  refillPerSecond: number,
  mark: ModelMark | undefined,
  now: number,
  entry: ModelEntry | undefined,
): boolean {
  // Below 0 by a penalty alone (no reservation stored a bound), the cost comes back as ever.
  if (!(t < 0) || !(modelReservedFloor(entry?.w, refillPerSecond, entry?.d) > 0)) return true;
  if (mark === undefined || !finite(mark.tokens) || !finite(mark.nowMs)) return false;
  const expected = mark.tokens + (Math.max(0, now - mark.nowMs) * refillPerSecond) / 1000;
  return t >= expected - 0.5;
}

/** A reservation's answer: the verdict, the bucket's tokens after it, and the wait until its turn. */
export interface ModelReservation {
  allowed: boolean;
  tokens: number;
  waitMs: number;
  /** The TTL in ms this call asked for, or undefined when it asked none. */
  ttlSet: number | undefined;
}

/** TTL of a written bucket: 2·B/R, or longer while the tokens are below 0 (it must not expire before it has refilled). */
export function modelTtlMs(policy: ModelPolicy, tokens: number): number {
  const idle = Math.ceil(((2 * policy.capacity) / policy.refillPerSecond) * 1000);
  if (tokens >= 0) return idle;
  return Math.max(idle, Math.ceil(((policy.capacity - tokens) / policy.refillPerSecond) * 1000));
}

export class BucketModel {
  readonly entries = new Map<string, ModelEntry>();

  /** The entry at `now`, after a TTL that ran out has removed it. */
  read(key: string, now: number): ModelEntry | undefined {
    const entry = this.entries.get(key);
    if (entry !== undefined && entry.expiresAt !== undefined && entry.expiresAt <= now) {
      this.entries.delete(key);
      return undefined;
    }
    return entry;
  }

  /** Whether `key` holds a hash whose TTL has run out by `now` (the test deletes it from Redis then). */
  expired(key: string, now: number): boolean {
    const entry = this.entries.get(key);
    return entry !== undefined && entry.expiresAt !== undefined && entry.expiresAt <= now;
  }

  /** Whether `key` holds a hash at `now` (without removing an expired one). */
  has(key: string, now: number): boolean {
    return this.peekEntry(key, now) !== undefined;
  }

  delete(key: string): void {
    this.entries.delete(key);
  }

  /**
   * Writes fields by hand, as `HSET` would: other fields and the TTL stay; a key that did not exist is
   * created with `expiresAt` (undefined: no TTL, as HSET on a new key).
   */
  corrupt(key: string, fields: Partial<Pick<ModelEntry, 'tokens' | 'ts' | 'b' | 'w' | 'd'>>, now: number, expiresAtIfNew?: number): void {
    const entry = this.read(key, now);
    if (entry === undefined) this.entries.set(key, { ...fields, expiresAt: expiresAtIfNew });
    else Object.assign(entry, fields);
  }

  /**
   * One call over distinct keys, atomically: every bucket is read and refilled; a take is allowed when
   * every bucket has its cost (then all are drained, else none); a refund is always allowed and gives
   * each its cost back, capped at capacity; a peek writes nothing. `dry`: compute without changing the
   * model (what a peek of the same call would see, with the verdict of `mode`).
   */
  decide(requests: readonly ModelRequest[], mode: ModelMode, now: number, dry = false, mark?: ModelMark): ModelOutcome {
    const keys = new Set(requests.map((r) => r.key));
    if (keys.size !== requests.length) throw new RateLimitError('ERR_RATE_LIMIT_STORE_CONTRACT', 'model: one bucket per key per call');
    // "A call with a penalty" (README, Penalties: Cost): a bucket of the call has blockSeconds.
    const penaltyCall = requests.some((r) => (r.blockSeconds ?? 0) > 0);
    const n = requests.length;
    const entries: (ModelEntry | undefined)[] = [];
    const tokens: number[] = [];
    const stamps: number[] = [];
    const repaired: boolean[] = [];
    const running: (number | undefined)[] = [];
    for (const r of requests) {
      const entry = dry ? this.peekEntry(r.key, now) : this.read(r.key, now);
      entries.push(entry);
      // A bucket exists when it has a tokens or a ts field; a missing one is full, stamped now.
      const exists = entry !== undefined && (entry.tokens !== undefined || entry.ts !== undefined);
      // A penalty runs while its end `b` is a finite time ahead of now, whoever started it (issue 22).
      const end = entry?.b;
      const runs = finite(end) && end > now ? end : undefined;
      running.push(runs);
      let t: number;
      let ts: number;
      let fixed = false;
      if (!exists || !finite(entry.tokens) || !finite(entry.ts)) {
        // Not a finite number (nan, inf, -inf, text) or absent: counts as a missing key.
        t = r.capacity;
        ts = now;
        fixed = exists;
      } else {
        t = entry.tokens;
        ts = entry.ts;
        // Tokens below what a penalty can leave (−blockSeconds·R; 0 without a penalty) count as 0; while
        // a penalty runs (started by any caller, with any numbers) down to −min(1e12, 1e12 s × R) are kept.
        const lowest = runs !== undefined ? -Math.min(1e12, 1e12 * r.refillPerSecond) : -((r.blockSeconds ?? 0) * r.refillPerSecond);
        if (t < 0 && t < lowest && t < -modelReservedFloor(entry.w, r.refillPerSecond, entry.d)) {
          t = 0;
          fixed = true;
        }
        // A stamp more than 1 s ahead of now is moved to now; within 1 s it is kept (no refill until then).
        if (ts > now + MODEL_FUTURE_TOLERANCE_MS) {
          ts = now;
          fixed = true;
        }
        // tokens + (now - ts) * R / 1000 for the time since the stamp, never more than one burst.
        if (now > ts) {
          t = t + ((now - ts) * r.refillPerSecond) / 1000;
          ts = now;
        }
      }
      if (t > r.capacity) t = r.capacity;
      tokens.push(t);
      stamps.push(ts);
      repaired.push(fixed);
    }
    // A running penalty refuses every take, whatever the caller's numbers. A floor must be left after the
    // cost (the guide: "never below its floor"); it never starts a penalty of its own (below: t < cost).
    const allowed =
      mode === 'refund' ||
      requests.every((r, i) => tokens[i] - (mode === 'take' ? (r.floor ?? 0) : 0) >= r.cost && running[i] === undefined);
    const ttlSet = new Array<number | undefined>(n).fill(undefined);
    const written = new Array<boolean>(n).fill(false);
    const after = tokens.slice();
    const ends = running.slice();
    if (mode !== 'peek') {
      requests.forEach((r, i) => {
        const block = r.blockSeconds ?? 0;
        let write = false;
        if (mode === 'refund' && !modelRefundGives(tokens[i], r.refillPerSecond, n === 1 ? mark : undefined, now, entries[i])) {
          // Below 0, turns are set: nothing is given back; only a repair is written.
          write = repaired[i];
        } else if (allowed) {
          after[i] = mode === 'refund' ? Math.min(r.capacity, tokens[i] + r.cost) : tokens[i] - r.cost;
          write = true;
        } else if (block > 0 && tokens[i] < r.cost && running[i] === undefined) {
          // The refusal that starts a penalty: min(tokens, penaltyCost − blockSeconds·R), ends now + blockSeconds.
          const floor = (r.penaltyCost ?? r.cost) - block * r.refillPerSecond;
          if (floor < after[i]) after[i] = floor;
          ends[i] = now + block * 1000;
          write = true;
        } else if (repaired[i]) {
          // A repaired bucket is written back even on a refusal.
          write = true;
        }
        // At least while its penalty runs (README: a key never expires before its penalty ends), at most 2e15 ms.
        let ttl = modelTtlMs(r, after[i]);
        const end = ends[i];
        if (end !== undefined && end - now > ttl) ttl = Math.min(Math.ceil(end - now), 2e15);
        const entry = entries[i];
        // A call never shortens a key's TTL (a caller with other numbers may have set a longer one).
        const expiresAt = entry?.expiresAt === undefined ? now + ttl : Math.max(entry.expiresAt, now + ttl);
        if (write) {
          written[i] = true;
          ttlSet[i] = ttl;
          if (!dry) {
            const next: ModelEntry = { ...(entry ?? {}), tokens: after[i], ts: stamps[i], expiresAt };
            if (ends[i] !== undefined && ends[i] !== running[i]) next.b = ends[i];
            this.entries.set(r.key, next);
          }
        } else if (entry !== undefined && (entry.tokens !== undefined || entry.ts !== undefined) && entry.expiresAt === undefined) {
          // A refused bucket that has no TTL gets one: nothing lives forever.
          ttlSet[i] = ttl;
          if (!dry) entry.expiresAt = now + ttl;
        }
      });
    }
    // A refused take is told, while a penalty runs, at most the tokens that give it its cost when the
    // penalty ends at its own refill (never below −1e12): its Retry-After is the penalty's remaining time.
    const told = allowed
      ? after
      : after.map((t, i) => {
          const end = running[i];
          if (end === undefined) return t;
          let most = requests[i].cost - ((end - now) * requests[i].refillPerSecond) / 1000;
          if (!(most >= -1e12)) most = -1e12;
          return most < t ? most : t;
        });
    const outcome: ModelOutcome = { allowed, tokens: told, ttlSet, written, running: running.map((end) => end !== undefined) };
    if (penaltyCall) outcome.penaltyMs = ends.map((end) => (end === undefined ? 0 : end - now));
    return outcome;
  }

  /**
   * A reservation of `r.cost` (acquire): the bucket as a take reads it (no penalty of its own); the wait
   * is ceil((cost − tokens) / R × 1000) ms, 0 when it has the cost, and at least until a running penalty
   * ends. Within `maxWaitMs` the cost is taken (below 0 if need be) and `w` becomes `boundMs` unless it
   * holds as much already; beyond it nothing is written but a repair (and a TTL on a key without one).
   */
  reserve(r: ModelRequest, maxWaitMs: number, boundMs: number, now: number): ModelReservation {
    const entry = this.read(r.key, now);
    const exists = entry !== undefined && (entry.tokens !== undefined || entry.ts !== undefined);
    const end = entry?.b;
    const runs = finite(end) && end > now ? end : undefined;
    let t: number;
    let ts: number;
    let fixed = false;
    if (!exists || !finite(entry.tokens) || !finite(entry.ts)) {
      t = r.capacity;
      ts = now;
      fixed = exists;
    } else {
      t = entry.tokens;
      ts = entry.ts;
      // As a take without a penalty of its own reads it: below 0 only what a running penalty or the reservations' bound keeps.
      const lowest = runs !== undefined ? -Math.min(1e12, 1e12 * r.refillPerSecond) : 0;
      if (t < 0 && t < lowest && t < -modelReservedFloor(entry.w, r.refillPerSecond, entry.d)) {
        t = 0;
        fixed = true;
      }
      if (ts > now + MODEL_FUTURE_TOLERANCE_MS) {
        ts = now;
        fixed = true;
      }
      if (now > ts) {
        t = t + ((now - ts) * r.refillPerSecond) / 1000;
        ts = now;
      }
    }
    if (t > r.capacity) t = r.capacity;
    let waitMs = t < r.cost ? Math.ceil(((r.cost - t) / r.refillPerSecond) * 1000) : 0;
    if (runs !== undefined && runs - now > waitMs) waitMs = Math.ceil(runs - now);
    const allowed = waitMs <= maxWaitMs;
    if (allowed) t -= r.cost;
    let ttl = modelTtlMs(r, t);
    if (runs !== undefined && runs - now > ttl) ttl = Math.min(Math.ceil(runs - now), 2e15);
    if (allowed || fixed) {
      const next: ModelEntry = {
        ...(entry ?? {}),
        tokens: t,
        ts,
        expiresAt: entry?.expiresAt === undefined ? now + ttl : Math.max(entry.expiresAt, now + ttl),
      };
      if (allowed && t < 0 && !(typeof next.w === 'number' && next.w >= boundMs)) next.w = boundMs;
      const depth = (boundMs * r.refillPerSecond) / 1000 + 1;
      if (allowed && t < 0 && !(typeof next.d === 'number' && next.d >= depth)) next.d = depth;
      this.entries.set(r.key, next);
      return { allowed, tokens: t, waitMs, ttlSet: ttl };
    }
    if (exists && entry.expiresAt === undefined) {
      // A refused bucket that has no TTL gets one: nothing lives forever.
      entry.expiresAt = now + ttl;
      return { allowed, tokens: t, waitMs, ttlSet: ttl };
    }
    return { allowed, tokens: t, waitMs, ttlSet: undefined };
  }

  /** The entry as `read` would see it, without removing an expired one. */
  private peekEntry(key: string, now: number): ModelEntry | undefined {
    return this.expired(key, now) ? undefined : this.entries.get(key);
  }
}
