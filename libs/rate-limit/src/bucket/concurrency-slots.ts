import { randomBytes } from 'node:crypto';
import { performance } from 'node:perf_hooks';
import type { DecisionEngine } from '../engine/decision-engine.js';
import { abortError, RateLimitTimeoutError } from '../errors/rate-limit.errors.js';
import { combinesSlots, type SlotAnswer, type SlotRequest, type SlotStore } from '../stores/slots.js';
import type { BucketRequest } from '../stores/token-bucket.js';
import { ThrottledLogger } from '../throttled-logger.js';
import { type CombinedTake, type ConcurrencySlot, noSlots, refused, shuttingDown, type SlotTake, unlimited } from './concurrency-slot.js';

export type { CombinedTake, ConcurrencySlot, SlotSource, SlotTake } from './concurrency-slot.js';

/** A slot held by this instance. */
interface Holding {
  take: SlotTake;
  holder: string;
  where: 'store' | 'local';
  /** When it was taken (performance.now()), for the moving average. */
  since: number;
  /** The slots in flight when the store last answered for it. */
  inFlight: number;
  timer: NodeJS.Timeout | undefined;
  released: boolean;
}

/** A take waiting on this instance for a slot of its key. */
interface Waiter {
  take: SlotTake;
  /** Called with a slot handed over by a holder of this instance, or undefined when it should ask again. */
  wake(handed: Holding | undefined): void;
}

/** The first retries of a waiting take, ms; then every `POLL_MAX_MS`. */
const POLL_FIRST_MS = 25;
const POLL_MAX_MS = 500;
/** Weight of the latest hold time in the moving average. */
const AVERAGE_WEIGHT = 0.2;

/**
 * This instance's concurrency slots: takes (and waits, up to `maxWaitMs`), renewals while a slot is
 * held (a timer per held slot, every third of its lease: nothing runs while nothing is in flight), and
 * give-backs. Each store call goes through the decision engine (deadline, breakers); a call that fails
 * follows `failureMode`. A take that times out and was granted after all is given back when its reply comes.
 */
export class ConcurrencySlots {
  /** Holder ids are this instance's id and a counter: unique across instances, never reused. */
  private readonly instance = randomBytes(6).toString('base64url');
  private next = 0;
  private readonly holding = new Set<Holding>();
  private readonly waiting = new Map<string, Waiter[]>();
  /** Moving average of hold times (ms) per scope: the refusal's `retryAfterSeconds` hint. */
  private readonly holdMs = new Map<string, number>();
  private readonly logger = new ThrottledLogger('RateLimit');
  private closing = false;

  constructor(
    private readonly engine: DecisionEngine,
    /** The store's slots; undefined when it has none (the module refuses `@ConcurrencyLimit` at start-up then). */
    private readonly store: SlotStore | undefined,
  ) {}

  /** Slots held by this instance now. */
  get held(): number {
    return this.holding.size;
  }

  async take(take: SlotTake): Promise<ConcurrencySlot> {
    if (this.closing) throw shuttingDown();
    take.signal?.throwIfAborted();
    const holder = this.holderId();
    const deadline = performance.now() + take.maxWaitMs;
    let answer = await this.ask(take, holder);
    let delay = POLL_FIRST_MS;
    while (!answer.held && answer.source === 'store' && !this.closing && take.signal?.aborted !== true) {
      const left = deadline - performance.now();
      if (left <= 0) break;
      const handed = await this.wait(take, Math.min(left, delay));
      if (handed !== undefined) return this.adopt(handed, take);
      // Woken by close(): asking again would take a slot the closing store may no longer give back.
      if (this.closing) break;
      delay = Math.min(delay * 2, POLL_MAX_MS);
      answer = await this.ask(take, holder);
    }
    if (this.closing || take.signal?.aborted === true) {
      await answer.release();
      throw this.closing ? shuttingDown() : abortError(take.signal!, 'a concurrency slot');
    }
    return answer;
  }

  /** Whether the store decides a take and a slot in one call (`takeWith`). */
  get combines(): boolean {
    return this.store !== undefined && combinesSlots(this.store);
  }

  /**
   * A take of `requests` and a slot, in one store call (a route's rate policies and its
   * `@ConcurrencyLimit`, decided together; no wait: `take.maxWaitMs` is not read). `slot` is undefined
   * when the buckets refused and no slot was asked for; `untaken`: the store refused the slot and left
   * the buckets untouched. When the store fails, `failureMode` decides the buckets, then the slot, as
   * for the two apart.
   */
  async takeWith(requests: readonly BucketRequest[], take: SlotTake): Promise<CombinedTake> {
    if (this.closing) throw shuttingDown();
    const store = this.store;
    if (store === undefined || !combinesSlots(store)) throw noSlots();
    const holder = this.holderId();
    const request: SlotRequest = { key: take.key, limit: take.limit, holder, leaseMs: take.leaseMs };
    const { verdict, slot } = await this.engine.decideWithSlot(requests, request, store);
    if (slot === undefined) return { verdict, slot: undefined, untaken: false };
    if (slot === 'failed') return { verdict, slot: verdict.allowed ? this.fallback(take, holder) : undefined, untaken: false };
    if (!slot.held) return { verdict, slot: refused(take, 'store', slot.inFlight, this.hint(take, slot.waitMs)), untaken: true };
    const held = this.hold(take, holder, 'store', slot.inFlight);
    if (this.closing) {
      // close() gave back what was held before this answer came.
      await held.release();
      throw shuttingDown();
    }
    return { verdict, slot: held, untaken: false };
  }

  /** The application is closing: waits end (`ERR_RATE_LIMIT_SHUTTING_DOWN`) and every held slot is given back. */
  async close(): Promise<void> {
    this.closing = true;
    for (const waiters of this.waiting.values()) for (const waiter of waiters.splice(0)) waiter.wake(undefined);
    this.waiting.clear();
    await Promise.allSettled([...this.holding].map((holding) => this.giveBack(holding)));
  }

  private holderId(): string {
    return `${this.instance}.${(this.next++).toString(36)}`;
  }

  /** One take call; the store's failure follows the take's `failureMode`. */
  private async ask(take: SlotTake, holder: string): Promise<ConcurrencySlot> {
    const store = this.store;
    if (store === undefined) throw noSlots();
    const request: SlotRequest = { key: take.key, limit: take.limit, holder, leaseMs: take.leaseMs };
    let pending: Promise<SlotAnswer> | undefined;
    let answer: SlotAnswer;
    try {
      answer = await this.engine.guarded(take.key, (sent) => (pending = store.takeSlot(request, { sent })));
    } catch (error) {
      if (error instanceof RateLimitTimeoutError && pending !== undefined) {
        // Redis may still grant it: a slot nobody holds would stay taken until its lease ends.
        pending
          .then((late) => (late.held ? this.engine.guarded(take.key, (sent) => store.giveBackSlot(take.key, holder, { sent })) : undefined))
          .catch(() => undefined);
      }
      return this.fallback(take, holder);
    }
    if (answer.held) return this.hold(take, holder, 'store', answer.inFlight);
    return refused(take, 'store', answer.inFlight, this.hint(take, answer.waitMs));
  }

  private fallback(take: SlotTake, holder: string): ConcurrencySlot {
    const local = this.engine.localFallback;
    local.count();
    if (take.failureMode === 'open') return unlimited(take);
    if (take.failureMode === 'closed') return refused(take, 'closed', 0, 1);
    const answer = local.store.takeSlotSync({ key: take.key, limit: take.limit, holder, leaseMs: take.leaseMs });
    if (answer.held) return this.hold(take, holder, 'local', answer.inFlight);
    return refused(take, 'local', answer.inFlight, this.hint(take, answer.waitMs));
  }

  private hold(take: SlotTake, holder: string, where: Holding['where'], inFlight: number): ConcurrencySlot {
    const holding: Holding = { take, holder, where, since: performance.now(), inFlight, timer: undefined, released: false };
    this.holding.add(holding);
    this.schedule(holding);
    return heldSlot(holding, () => this.release(holding));
  }

  /**
   * A slot handed over by a holder of this instance to a waiter with the same limit and lease: the same
   * slot, now the waiter's, with no store call. Its lease was renewed at most a third of it ago, so the
   * next renewal is due a third of it from now, as after a take.
   */
  private adopt(handed: Holding, take: SlotTake): ConcurrencySlot {
    const holding: Holding = { ...handed, take, since: performance.now(), timer: undefined, released: false };
    this.holding.add(holding);
    this.schedule(holding);
    return heldSlot(holding, () => this.release(holding));
  }

  /** Waits for a handover up to `ms`; undefined: ask the store again. Rejects when the signal aborts. */
  private wait(take: SlotTake, ms: number): Promise<Holding | undefined> {
    return new Promise<Holding | undefined>((resolve, reject) => {
      // An 'abort' listener added to a signal that has aborted already would never be called.
      if (take.signal?.aborted === true) return reject(abortError(take.signal, 'a concurrency slot'));
      let waiters = this.waiting.get(take.key);
      if (waiters === undefined) this.waiting.set(take.key, (waiters = []));
      const list = waiters;
      const done = () => {
        clearTimeout(timer);
        take.signal?.removeEventListener('abort', onAbort);
        const at = list.indexOf(waiter);
        if (at >= 0) list.splice(at, 1);
        if (list.length === 0 && this.waiting.get(take.key) === list) this.waiting.delete(take.key);
      };
      const waiter: Waiter = {
        take,
        wake: (handed) => {
          done();
          resolve(handed);
        },
      };
      const onAbort = () => {
        done();
        reject(abortError(take.signal!, 'a concurrency slot'));
      };
      const timer = setTimeout(() => waiter.wake(undefined), ms);
      take.signal?.addEventListener('abort', onAbort, { once: true });
      list.push(waiter);
    });
  }

  private schedule(holding: Holding): void {
    const every = Math.max(1, Math.floor(holding.take.leaseMs / 3));
    holding.timer = setTimeout(() => void this.renew(holding), every);
    holding.timer.unref();
  }

  /** Renews a held slot (its lease ends `leaseMs` from now), then schedules the next renewal. */
  private async renew(holding: Holding): Promise<void> {
    if (holding.released) return;
    const { take, holder } = holding;
    const request: SlotRequest = { key: take.key, limit: take.limit, holder, leaseMs: take.leaseMs };
    try {
      const answer =
        holding.where === 'local'
          ? this.engine.localFallback.store.takeSlotSync(request)
          : await this.engine.guarded(take.key, (sent) => this.store!.takeSlot(request, { sent }));
      if (answer.held) holding.inFlight = answer.inFlight;
      else {
        this.logger.warn(
          `A concurrency slot of ${take.scope} ran past its lease (${take.leaseMs} ms) before it was renewed, and all ` +
            `${take.limit} are taken again: this request runs over the limit (was the event loop blocked?)`,
        );
      }
    } catch {
      // The store failed: the next renewal tries again, within the lease's other two thirds.
    }
    if (!holding.released) this.schedule(holding);
  }

  /** The work is done: the slot goes to the first waiter of this instance, or back to the store. */
  private async release(holding: Holding): Promise<void> {
    if (holding.released) return;
    holding.released = true;
    clearTimeout(holding.timer);
    this.holding.delete(holding);
    const { take } = holding;
    const held = performance.now() - holding.since;
    const average = this.holdMs.get(take.scope);
    this.holdMs.set(take.scope, average === undefined ? held : average + AVERAGE_WEIGHT * (held - average));
    const waiter = this.waiting.get(take.key)?.[0];
    if (waiter !== undefined && waiter.take.limit === take.limit && waiter.take.leaseMs === take.leaseMs && !this.closing) {
      waiter.wake(holding);
      return;
    }
    await this.giveBack(holding);
  }

  private async giveBack(holding: Holding): Promise<void> {
    holding.released = true;
    clearTimeout(holding.timer);
    this.holding.delete(holding);
    const { key } = holding.take;
    if (holding.where === 'local') {
      this.engine.localFallback.store.giveBackSlotSync(key, holding.holder);
      return;
    }
    try {
      await this.engine.guarded(key, (sent) => this.store!.giveBackSlot(key, holding.holder, { sent }));
    } catch (error) {
      this.logger.warn(
        `A concurrency slot of ${holding.take.scope} could not be given back (${error instanceof Error ? error.message : String(error)}): ` +
          `it frees itself when its lease ends, within ${holding.take.leaseMs} ms`,
      );
    }
  }

  /** The refusal's hint: the average hold time here, within [1 s, the earliest other lease's end]. */
  private hint(take: SlotTake, untilLeaseEndMs: number): number {
    const average = this.holdMs.get(take.scope) ?? 1000;
    const bound = untilLeaseEndMs > 0 ? untilLeaseEndMs : Infinity;
    return Math.max(1, Math.ceil(Math.min(average, bound) / 1000));
  }
}

function heldSlot(holding: Holding, release: () => Promise<void>): ConcurrencySlot {
  return {
    held: true,
    source: holding.where,
    limit: holding.take.limit,
    inFlight: holding.inFlight,
    retryAfterSeconds: 0,
    release,
    [Symbol.asyncDispose]: release,
  };
}
