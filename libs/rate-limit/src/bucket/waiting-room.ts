import { performance } from 'node:perf_hooks';
import type { DecisionEngine } from '../engine/decision-engine.js';
import type { Reservation } from '../engine/fallback.js';
import { abortError, RateLimitError, RateLimitUnavailableError, RateLimitWaitTooLongError } from '../errors/rate-limit.errors.js';
import type { BucketDecision } from '../rate-limit.interfaces.js';
import type { FailureMode } from '../rate-limit.options.js';
import type { ReserveOptions } from '../stores/bucket-store.interface.js';
import { type BucketRequest, toDecision } from '../stores/token-bucket.js';

/** What `BucketService.acquire()` resolves with: `consume()`'s decision (always allowed) and the wait. */
export interface AcquireDecision extends BucketDecision {
  /** How long the call took, in ms, from the call until it resolved (the round trip and the wait for its turn). */
  waitedMs: number;
  /**
   * The wait the store announced, in ms: the caller's turn came this long after the store's answer (0: the
   * tokens were there; also 0 when `failureMode: 'open'` let the call through).
   */
  scheduledWaitMs: number;
  /**
   * When the caller's turn came by the clock of the store that decided (ms since the epoch; Redis TIME
   * for the Redis store): its time of the decision plus `scheduledWaitMs`. Absent when the store does not
   * tell (a store of your own) or nothing was reserved (`failureMode: 'open'`).
   */
  turnAt?: number;
}

/** One call waiting for its turn. */
interface Waiter {
  request: BucketRequest;
  reservation: Reservation;
  timer: NodeJS.Timeout;
  reject: (error: unknown) => void;
  /** Takes the abort listener off the signal. */
  detach: () => void;
}

/**
 * The waits of one \`AbortSignal\`: one listener on the signal for all of them, however many calls share
 * it (a listener per call would pass Node's limit of 10 and warn, \`MaxListenersExceededWarning\`).
 */
class SignalWaits {
  private readonly waits = new WeakMap<AbortSignal, Set<() => void>>();

  /** Calls \`onAbort\` when \`signal\` aborts; answers what takes it off again. */
  add(signal: AbortSignal, onAbort: () => void): () => void {
    let set = this.waits.get(signal);
    if (set === undefined) {
      const waits = (set = new Set());
      this.waits.set(signal, waits);
      const fire = () => {
        this.waits.delete(signal);
        for (const wait of [...waits]) wait();
      };
      signal.addEventListener('abort', fire, { once: true });
    }
    const own = set;
    own.add(onAbort);
    return () => {
      own.delete(onAbort);
    };
  }
}

/** A call of `WaitingRoom.acquire`. */
export interface AcquireCall {
  /** The bucket's name, for error messages. */
  name: string;
  maxWaitMs: number;
  boundMs: number;
  signal: AbortSignal | undefined;
  failureMode: FailureMode;
}

/**
 * The calls of `BucketService.acquire()` in this process: each reserves its tokens with one store call
 * (`DecisionEngine.reserve`; the calls of one event-loop turn share it), then waits for its turn on a
 * timer of its own. No polling: the store said
 * when the tokens exist, and they are already the caller's. A wait that is aborted, or ended by the
 * application's shutdown, gives its reservation back. At most `maxWaiting` calls (in flight or
 * waiting) at once.
 */
export class WaitingRoom {
  private readonly waiting = new Set<Waiter>();
  private readonly signals = new SignalWaits();
  /** Calls in flight to the store or waiting for their turn. */
  private calls = 0;
  private closed = false;

  constructor(
    private readonly engine: DecisionEngine,
    private readonly maxWaiting: number,
  ) {}

  /** Calls in flight or waiting now. */
  get size(): number {
    return this.calls;
  }

  async acquire(request: BucketRequest, call: AcquireCall): Promise<AcquireDecision> {
    const { signal } = call;
    if (this.closed) throw shuttingDown();
    if (signal?.aborted) throw abortError(signal);
    if (this.calls >= this.maxWaiting) {
      throw new RateLimitError(
        'ERR_RATE_LIMIT_TOO_MANY_WAITING',
        `bucket "${call.name}": ${this.calls} calls wait for tokens in this process already (acquire.maxWaiting ${this.maxWaiting})`,
      );
    }
    const started = performance.now();
    this.calls++;
    try {
      const reserve: ReserveOptions = { maxWaitMs: call.maxWaitMs, boundMs: call.boundMs };
      const reservation = await this.engine.reserve(request, reserve, call.failureMode);
      if (reservation.source === 'closed') throw new RateLimitUnavailableError('failureMode is closed');
      if (!reservation.allowed) throw new RateLimitWaitTooLongError(reservation.waitMs, call.maxWaitMs, call.name);
      // Aborted or shut down while the store decided: the reservation is given back at once.
      if (signal?.aborted || this.closed) {
        void this.giveBack(request, reservation);
        throw signal?.aborted ? abortError(signal) : shuttingDown();
      }
      if (reservation.waitMs > 0) await this.wait(request, reservation, signal);
      const decision = toDecision(request, reservation.tokens, request.cost, true) as AcquireDecision;
      decision.waitedMs = performance.now() - started;
      decision.scheduledWaitMs = reservation.waitMs;
      if (reservation.turnAt !== undefined) decision.turnAt = reservation.turnAt;
      return decision;
    } finally {
      this.calls--;
    }
  }

  /**
   * The application is closing: every waiting call is rejected (`ERR_RATE_LIMIT_SHUTTING_DOWN`) and its
   * reservation given back; resolves when the store has answered those refunds (or failed to). Calls that
   * come later are rejected the same way.
   *
   * The give-backs go latest turn first, in one burst (they share calls, in that order): a store gives back
   * only a reservation that is still the last of its bucket, so this process's reservations at the end of a
   * queue all come back, each making the one before it the last; those with other callers' turns after them
   * are lost (the bucket under-admits for their moments, never over).
   */
  async close(): Promise<void> {
    this.closed = true;
    const waiters = [...this.waiting].sort((a, b) => turnOf(b) - turnOf(a));
    const refunds: Promise<unknown>[] = [];
    for (const waiter of waiters) {
      this.end(waiter);
      refunds.push(this.giveBack(waiter.request, waiter.reservation));
      waiter.reject(shuttingDown());
    }
    await Promise.all(refunds);
  }

  private wait(request: BucketRequest, reservation: Reservation, signal: AbortSignal | undefined): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      const onAbort = () => {
        this.end(waiter);
        void this.giveBack(request, reservation);
        reject(abortError(signal!));
      };
      const waiter: Waiter = {
        request,
        reservation,
        reject,
        timer: setTimeout(() => {
          this.end(waiter);
          resolve();
        }, reservation.waitMs),
        detach: signal === undefined ? noop : this.signals.add(signal, onAbort),
      };
      this.waiting.add(waiter);
    });
  }

  private end(waiter: Waiter): void {
    clearTimeout(waiter.timer);
    waiter.detach();
    this.waiting.delete(waiter);
  }

  /**
   * Gives a reservation back to where it was made (the store, or the in-process buckets of `'local'`),
   * naming it (`Reservation.mark`): the store gives its tokens back only while it is the last of its
   * bucket (see docs/explanation/reservations.md). Never rejects.
   */
  private giveBack(request: BucketRequest, reservation: Reservation): Promise<unknown> {
    if (request.cost === 0) return Promise.resolve();
    return this.engine.giveBack([request], reservation.source, reservation.mark).catch(() => undefined);
  }
}

function noop(): void {}

/** A waiter's turn by its store's clock; its wait when the store did not tell its clock. */
function turnOf(waiter: Waiter): number {
  return waiter.reservation.turnAt ?? waiter.reservation.waitMs;
}

function shuttingDown(): RateLimitError {
  return new RateLimitError('ERR_RATE_LIMIT_SHUTTING_DOWN', 'the application is closing: the wait for a token was ended');
}
