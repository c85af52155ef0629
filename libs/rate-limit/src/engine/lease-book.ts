import { randomUUID } from 'node:crypto';
import { performance } from 'node:perf_hooks';
import type { BucketRequest } from '../stores/token-bucket.js';
import { LeaseDemand } from './lease-demand.js';

/** What a lease call asks (lease.lua's arguments but the bucket's). */
export interface LeaseAsk {
  holder: string;
  /** Of the tokens of the holder's live lease: those it keeps, and those it gives back. */
  kept: number;
  returned: number;
  /** Tokens it asks for now (0: give back only). */
  want: number;
  lifeMs: number;
}

/** What a lease call answers. */
export interface LeaseAnswer {
  /** Tokens leased now. */
  granted: number;
  /** Tokens of the holder's lease it keeps (fewer than asked when the lease ended in Redis before the call). */
  kept: number;
  /** The bucket's tokens after the call (fractional; below 0 under a penalty). */
  tokens: number;
  /** Ms a running penalty still runs (0: none). */
  penaltyMs: number;
}

/** A store that leases (the Redis store): one lease.lua call per ask. */
export interface LeasingStore {
  lease(request: BucketRequest, ask: LeaseAsk, now?: number, sent?: () => void): Promise<LeaseAnswer>;
}

/** Whether `store` leases tokens. */
export function leases(store: object): store is LeasingStore {
  return typeof (store as Partial<LeasingStore>).lease === 'function';
}

/** A leased decision of one request: spent here, to be decided exactly (the key is cold), or refused by the store. */
export type LeaseTake = { kind: 'spent'; tokens: number } | { kind: 'exact' } | { kind: 'refused'; tokens: number };

/** This instance's lease of one bucket. */
interface Held {
  /** Whole tokens this instance may still spend, until `until` (performance.now() ms). */
  tokens: number;
  until: number;
  /** The bucket's tokens in Redis as this instance last saw them (a lease call's or an exact decision's answer). */
  seen: number;
  /** Calls sent for this lease so far: a spend undone after another call was sent is not put back here. */
  sends: number;
  /** The call in flight, if any: decisions that find no token wait for it rather than send another. */
  asking: Promise<void> | undefined;
  /** The cost of the decisions waiting for that call. */
  waiting: number;
  /** The bucket's demand here: hot or not, and its decisions per second. */
  demand: LeaseDemand;
  /** Gives the unspent tokens back shortly before the lease ends, when no renewal came first. */
  timer: NodeJS.Timeout | undefined;
  /** The numbers of the last call, for the give-backs at the end and at close. */
  capacity: number;
  refillPerSecond: number;
  lifeMs: number;
}

/** A spend, as its undo needs it: the lease it came from and the calls sent for it then. */
interface Spend {
  held: Held;
  sends: number;
}

/** How long before a lease's end its unspent tokens are given back (at most a quarter of its life). */
const GIVE_BACK_EARLY_MS = 100;
/** The most lease calls one decision waits for before it is refused (each asks for every waiting decision's cost). */
const MAX_ROUNDS = 3;
/** A batch is at most this fraction of the tokens the bucket held last time: less as it empties. */
const BATCH_SHARE_OF_BUCKET = 0.25;
/** Without `maxBatch`, a batch is at most this fraction of the capacity. */
const BATCH_SHARE_OF_CAPACITY = 0.05;
/** A batch is sized to this fraction of a lease's life at the measured demand (the rest is margin to renew in). */
const BATCH_SHARE_OF_LIFE = 0.5;

/**
 * The leases of this instance (docs/explanation/leases.md): per leased bucket, a batch of tokens taken
 * out of Redis in one call and spent here without a call per decision, until the lease ends. A bucket is
 * leased only while it is hot here (lease-demand.ts: a run of decisions without a pause, and a
 * batch larger than one request's cost) and full enough in Redis (a batch is at most a quarter of what it
 * held); otherwise its decisions are exact, one call each, as without leases. A renewal goes out when
 * half a batch is spent, keeping what is left and asking for the rest in the same call; a lease no
 * renewal followed gives its tokens back shortly before its end. Bounded: at most `maxKeys` buckets are
 * followed (the oldest is forgotten first; its tokens are lost, never over-spent).
 */
export class LeaseBook {
  /** This instance's id in the buckets' lease fields. */
  readonly holder = randomUUID();
  private readonly held = new Map<string, Held>();
  /** The spends of decisions not yet settled, for their undo or refund. */
  private readonly spends = new WeakMap<BucketRequest, Spend>();
  private closed = false;

  constructor(
    /** One lease call, through the engine's deadlines and breakers; rejects when the store fails. */
    private readonly call: (request: BucketRequest, ask: LeaseAsk, sent: () => void) => Promise<LeaseAnswer>,
    private readonly maxKeys: number,
  ) {}

  /**
   * Decides `request` (a leased one) from this instance's lease when it can: spent (a token estimate
   * for the headers), refused by the store's answer to a lease call, or to be decided exactly (the
   * bucket is cold here, or nearly empty). Rejects when a needed lease call fails.
   */
  take(request: BucketRequest): LeaseTake | Promise<LeaseTake> {
    const held = this.closed ? undefined : this.follow(request.key);
    if (held === undefined) return EXACT;
    const now = performance.now();
    held.demand.count(now);
    if (held.tokens >= request.cost && now < held.until) return this.spend(request, held);
    if (held.asking !== undefined) return this.wait(request, held, 0);
    if (now >= held.until) held.tokens = 0;
    const batch = this.batchOf(request, held);
    if (batch <= request.cost) return EXACT;
    this.ask(request, held, batch);
    return this.wait(request, held, 0);
  }

  /** An exact decision of a leased bucket: what it held afterwards, for the next batch's size. */
  saw(request: BucketRequest, tokens: number): void {
    const held = this.held.get(request.key);
    if (held !== undefined) held.seen = tokens;
  }

  /**
   * Gives a spend of `request` back to the lease it came from, when no call was sent for that lease
   * since (else the store already counts it as spent, and only an exact refund may give it back):
   * answers the token estimate, or undefined when the caller must refund exactly.
   */
  putBack(request: BucketRequest): number | undefined {
    const spend = this.spends.get(request);
    if (spend === undefined) return undefined;
    this.spends.delete(request);
    const { held, sends } = spend;
    if (held.sends !== sends || performance.now() >= held.until || this.held.get(request.key) !== held) return undefined;
    held.tokens += request.cost;
    return estimate(request, held);
  }

  /** Whether `request` was decided from a lease here (and not yet given back). */
  spent(request: BucketRequest): boolean {
    return this.spends.has(request);
  }

  /** The application is closing: every live lease gives its tokens back, in one call per bucket; no lease is taken after. */
  async close(): Promise<void> {
    this.closed = true;
    const now = performance.now();
    const calls: Promise<unknown>[] = [];
    for (const [key, held] of this.held) {
      if (held.timer !== undefined) clearTimeout(held.timer);
      if (held.tokens > 0 && now < held.until) {
        const returned = held.tokens;
        held.tokens = 0;
        held.sends++;
        const request: BucketRequest = { key, capacity: held.capacity, refillPerSecond: held.refillPerSecond, cost: 0 };
        const ask = { holder: this.holder, kept: 0, returned, want: 0, lifeMs: held.lifeMs };
        calls.push(this.call(request, ask, () => undefined).catch(() => undefined));
      }
    }
    this.held.clear();
    await Promise.all(calls);
  }

  private spend(request: BucketRequest, held: Held): LeaseTake {
    held.tokens -= request.cost;
    this.spends.set(request, { held, sends: held.sends });
    // Half a batch spent: renew now, while the rest is spent, so that no decision waits for the call.
    if (held.asking === undefined) {
      const batch = this.batchOf(request, held);
      if (held.tokens < batch * 0.5 && batch > request.cost) this.ask(request, held, batch);
    }
    return { kind: 'spent', tokens: estimate(request, held) };
  }

  /**
   * Waits for the call in flight, then spends when the lease has the cost. When it does not but the
   * bucket still had the cost after the call (the decisions that waited wanted more than the batch),
   * asks again, up to MAX_ROUNDS calls: only a bucket without the cost refuses.
   */
  private async wait(request: BucketRequest, held: Held, round: number): Promise<LeaseTake> {
    held.waiting += request.cost;
    try {
      await held.asking;
    } finally {
      held.waiting -= request.cost;
    }
    const live = performance.now() < held.until;
    if (held.tokens >= request.cost && live) return this.spend(request, held);
    // The bucket has the cost when what this instance holds and what Redis has left make it (a cost > 1).
    const has = held.seen + (live ? held.tokens : 0);
    if (has >= request.cost && round < MAX_ROUNDS && !this.closed) {
      if (held.asking === undefined) {
        // Cold by now (it waited for the give-back of a lease that went cold): decided exactly.
        if (!held.demand.hot) return EXACT;
        this.ask(request, held, Math.max(this.batchOf(request, held), request.cost));
      }
      return this.wait(request, held, round + 1);
    }
    // A refusal says the bucket lacks the cost, as an exact one does (Retry-After >= 1, fewer than cost
    // tokens remaining): when it had it after all (the rounds ran out while others took it), just under it.
    const tokens = Math.min(request.capacity, has);
    return { kind: 'refused', tokens: tokens < request.cost ? tokens : request.cost * (1 - Number.EPSILON) };
  }

  /**
   * One lease call: keeps what this instance holds (at most a batch; the rest goes back) and asks for
   * the batch's remainder. The lease's end here counts from before the call is sent, so it never
   * outlives the end Redis gives it (counted from when the script runs).
   */
  private ask(request: BucketRequest, held: Held, batch: number): void {
    const lifeMs = request.lease!.lifeMs;
    const live = performance.now() < held.until ? held.tokens : 0;
    const kept = Math.min(live, batch);
    const returned = live - kept;
    // Enough for the decisions waiting for this call too (they asked while the last one was in flight).
    const want = Math.max(batch - kept, request.cost + held.waiting);
    held.tokens = kept;
    held.sends++;
    held.capacity = request.capacity;
    held.refillPerSecond = request.refillPerSecond;
    held.lifeMs = lifeMs;
    let sentAt = performance.now();
    const asking = this.call(request, { holder: this.holder, kept, returned, want, lifeMs }, () => (sentAt = performance.now())).then(
      (answer) => {
        // Spent meanwhile came out of the kept tokens; Redis keeps fewer only when the lease had ended there.
        held.tokens = Math.min(held.tokens, answer.kept) + answer.granted;
        held.until = held.tokens > 0 ? sentAt + lifeMs : 0;
        held.seen = answer.tokens;
        this.arm(request.key, held);
      },
    );
    held.asking = asking;
    const done = () => {
      if (held.asking === asking) held.asking = undefined;
    };
    asking.then(done, done);
  }

  /**
   * Sets the give-back of a lease's unspent tokens for shortly before its end (GIVE_BACK_EARLY_MS), so
   * that a bucket that went cold gets them back instead of losing them; a renewal sets it again. One
   * timer per live lease, none while nothing is held; it does not keep the process alive.
   */
  private arm(key: string, held: Held): void {
    if (held.timer !== undefined) clearTimeout(held.timer);
    held.timer = undefined;
    if (held.until === 0 || this.closed) return;
    const early = Math.min(GIVE_BACK_EARLY_MS, held.lifeMs / 4);
    const timer = setTimeout(() => this.expire(key, held), Math.max(0, held.until - early - performance.now()));
    timer.unref();
    held.timer = timer;
  }

  /**
   * The lease is about to end and no renewal came (the bucket went cold here, or its lease was spent and
   * it is decided exactly now): what it still holds goes back to the bucket in one call, which also
   * deletes the lease from the hash, so the bucket's exact decisions take the script's fast path again
   * instead of the general one until the key expires. A timer that fired late (a busy event loop) gives
   * nothing back, the tokens being lost by then, but its call still deletes the ended lease.
   */
  private expire(key: string, held: Held): void {
    held.timer = undefined;
    if (this.held.get(key) !== held || held.asking !== undefined || held.until === 0) return;
    const returned = performance.now() < held.until ? held.tokens : 0;
    held.tokens = 0;
    held.until = 0;
    held.sends++;
    const request: BucketRequest = { key, capacity: held.capacity, refillPerSecond: held.refillPerSecond, cost: 0 };
    // In flight like a renewal: a decision meanwhile waits for it, so no lease call of this holder can
    // run before it in Redis and have its new lease deleted by it (whose tokens would then be refilled).
    const giving = this.call(request, { holder: this.holder, kept: 0, returned, want: 0, lifeMs: held.lifeMs }, () => undefined).then(
      (answer) => {
        held.seen = answer.tokens;
      },
    );
    held.asking = giving;
    const done = () => {
      if (held.asking === giving) held.asking = undefined;
    };
    giving.then(done, done);
  }

  /** The tokens a batch of this bucket should hold now: by the demand here, the capacity and what the bucket held last time. */
  private batchOf(request: BucketRequest, held: Held): number {
    // Cold (one call per decision, as without leases) until hot (lease-demand.ts).
    if (!held.demand.hot) return 0;
    const byDemand = Math.ceil(held.demand.rate * request.lease!.lifeMs * BATCH_SHARE_OF_LIFE * 0.001);
    const most = request.lease!.maxBatch ?? Math.max(1, Math.floor(request.capacity * BATCH_SHARE_OF_CAPACITY));
    const byBucket = Math.floor(held.seen * BATCH_SHARE_OF_BUCKET);
    return Math.min(byDemand, most, byBucket);
  }

  /** The lease of `key`, followed from now on if it was not; the oldest is forgotten when `maxKeys` are. */
  private follow(key: string): Held | undefined {
    let held = this.held.get(key);
    if (held !== undefined) return held;
    if (this.held.size >= this.maxKeys) {
      const oldest = this.held.keys().next().value as string;
      const forgotten = this.held.get(oldest)!;
      if (forgotten.timer !== undefined) clearTimeout(forgotten.timer);
      this.held.delete(oldest);
    }
    held = {
      tokens: 0,
      until: 0,
      seen: Infinity,
      sends: 0,
      asking: undefined,
      timer: undefined,
      waiting: 0,
      demand: new LeaseDemand(performance.now()),
      capacity: 0,
      refillPerSecond: 0,
      lifeMs: 0,
    };
    this.held.set(key, held);
    return held;
  }
}

const EXACT: LeaseTake = { kind: 'exact' };

/** What the headers say a leased bucket holds: this instance's tokens and what Redis held at the last call, at most the capacity. */
function estimate(request: BucketRequest, held: Held): number {
  const tokens = held.tokens + (Number.isFinite(held.seen) ? Math.max(0, held.seen) : request.capacity);
  return tokens < request.capacity ? tokens : request.capacity;
}
