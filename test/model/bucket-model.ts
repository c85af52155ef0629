/**
 * A reference model of the token bucket, written from DESIGN.md ("The algorithm") and the README
 * ("The algorithm": bounds, one bucket per key per call, state it does not trust, clocks; "Penalties
 * (`blockSeconds`)"). It imports nothing from the library on purpose: the property test in this folder
 * compares the Lua script and the memory store with it, so it must not share their code.
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
}

export interface ModelRequest extends ModelPolicy {
  key: string;
  cost: number;
}

/** A stored hash: each field may be absent (undefined) or hold anything that was written there. */
export interface ModelEntry {
  tokens?: number;
  ts?: number;
  /** When a penalty ends (the hash field `b`), in ms. */
  b?: number;
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
  /** Per bucket: the TTL in ms this call set on the key, or undefined when it set none. */
  ttlSet: (number | undefined)[];
  /** Per bucket: whether this call wrote the hash (tokens and ts). */
  written: boolean[];
}

const finite = (x: number | undefined): x is number => typeof x === 'number' && Number.isFinite(x);

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
  corrupt(key: string, fields: Partial<Pick<ModelEntry, 'tokens' | 'ts' | 'b'>>, now: number, expiresAtIfNew?: number): void {
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
  decide(requests: readonly ModelRequest[], mode: ModelMode, now: number, dry = false): ModelOutcome {
    const keys = new Set(requests.map((r) => r.key));
    if (keys.size !== requests.length) throw new Error('model: one bucket per key per call');
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
      // A penalty runs while its end `b` is a finite time ahead of now (read only in calls with penalties).
      const end = penaltyCall ? entry?.b : undefined;
      running.push(finite(end) && end > now ? end : undefined);
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
        // Tokens below what a penalty can leave (−blockSeconds·R; 0 without a penalty) count as 0.
        const lowest = -((r.blockSeconds ?? 0) * r.refillPerSecond);
        if (t < 0 && t < lowest) {
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
    const allowed = mode === 'refund' || requests.every((r, i) => tokens[i] >= r.cost);
    const ttlSet = new Array<number | undefined>(n).fill(undefined);
    const written = new Array<boolean>(n).fill(false);
    const after = tokens.slice();
    const ends = running.slice();
    if (mode !== 'peek') {
      requests.forEach((r, i) => {
        const block = r.blockSeconds ?? 0;
        let write = false;
        if (allowed) {
          after[i] = mode === 'refund' ? Math.min(r.capacity, tokens[i] + r.cost) : tokens[i] - r.cost;
          write = true;
        } else if (block > 0 && tokens[i] < r.cost && running[i] === undefined) {
          // The refusal that starts a penalty: min(tokens, cost − blockSeconds·R), ends now + blockSeconds.
          const floor = r.cost - block * r.refillPerSecond;
          if (floor < after[i]) after[i] = floor;
          ends[i] = now + block * 1000;
          write = true;
        } else if (repaired[i]) {
          // A repaired bucket is written back even on a refusal.
          write = true;
        }
        const ttl = modelTtlMs(r, after[i]);
        const entry = entries[i];
        if (write) {
          written[i] = true;
          ttlSet[i] = ttl;
          if (!dry) {
            const next: ModelEntry = { ...(entry ?? {}), tokens: after[i], ts: stamps[i], expiresAt: now + ttl };
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
    const outcome: ModelOutcome = { allowed, tokens: after, ttlSet, written };
    if (penaltyCall) outcome.penaltyMs = ends.map((end) => (end === undefined ? 0 : end - now));
    return outcome;
  }

  /** The entry as `read` would see it, without removing an expired one. */
  private peekEntry(key: string, now: number): ModelEntry | undefined {
    return this.expired(key, now) ? undefined : this.entries.get(key);
  }
}
