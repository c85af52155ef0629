import { RateLimitTimeoutError } from '../errors/rate-limit.errors.js';

/**
 * Settles like `promise`, or rejects after `ms`. Node runs expired timers before it reads sockets, so a
 * reply that has already arrived could lose to the timer on a busy process; the timer therefore waits
 * one more turn (`setImmediate`, after the poll phase) before it declares the timeout.
 */
export function withTimeout<T>(promise: Promise<T>, ms: number): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    let settled = false;
    const timer = setTimeout(
      () =>
        setImmediate(() => {
          if (settled) return;
          settled = true;
          reject(new RateLimitTimeoutError(ms));
        }),
      ms,
    );
    promise.then(
      (value) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        resolve(value);
      },
      (error: unknown) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        reject(error);
      },
    );
  });
}

/** One promise racing its deadline: a node of the `Deadlines` list while its clock runs. */
interface Race {
  /** NaN until the clock starts. */
  deadline: number;
  reject: (error: unknown) => void;
  /** Settled (or timed out): a late start must not put it on the list. */
  done: boolean;
  prev: Race | undefined;
  next: Race | undefined;
}

/**
 * `withTimeout` for a stream of promises that share one timeout, as every decision of a module does.
 * Their clocks start in the order the calls are sent, so the running ones form a list in deadline order
 * and one timer, armed for the oldest, serves them all: no timer is created or cleared per decision,
 * and a race leaves the list the moment its promise settles (nothing outlives it but garbage). A
 * deadline is declared, as in `withTimeout`, only after pending I/O has been read once more
 * (`setImmediate`).
 *
 * The deadline measures the store, not the app: `raceSent` starts a decision's clock when the store
 * hands its command to the client (`sent`), not when the decision is asked for. Decisions that share a
 * script call wait for the end of the event-loop turn before they are written; a handler that holds the
 * loop in that turn (a bcrypt hash, a cold burst being parsed) delays their writing, and that time is
 * the app's, not Redis'. What counts is from the write on: Redis, the network, a client's own queue.
 */
export class Deadlines {
  private head: Race | undefined;
  private tail: Race | undefined;
  /** The timer armed for the oldest deadline, or the expiry queued for the next check phase. */
  private timer: NodeJS.Timeout | NodeJS.Immediate | undefined;

  constructor(
    private readonly ms: number,
    private readonly clock: () => number = () => performance.now(),
  ) {}

  /** Settles like `promise`, or rejects with `RateLimitTimeoutError` once `ms` have passed from now. */
  race<T>(promise: Promise<T>): Promise<T> {
    return this.raceSent((sent) => {
      sent();
      return promise;
    });
  }

  /**
   * Settles like the promise `send` returns, or rejects with `RateLimitTimeoutError` once `ms` have
   * passed from the first call of `sent`. `send` must call `sent` when its work is handed over (a
   * command written to the client), or settle without it; later calls are ignored.
   */
  raceSent<T>(send: (sent: () => void) => Promise<T>): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      const race: Race = { deadline: Number.NaN, reject, done: false, prev: undefined, next: undefined };
      send(() => this.start(race)).then(
        (value) => {
          if (this.settle(race)) resolve(value);
        },
        (error: unknown) => {
          if (this.settle(race)) reject(error);
        },
      );
    });
  }

  /** Starts a race's clock: it joins the end of the list (its deadline is the latest so far). */
  private start(race: Race): void {
    if (race.done || !Number.isNaN(race.deadline)) return;
    race.deadline = this.clock() + this.ms;
    race.prev = this.tail;
    if (this.tail === undefined) this.head = race;
    else this.tail.next = race;
    this.tail = race;
    if (this.timer === undefined) this.arm(this.ms);
  }

  /** Ends a race that settled: false when it had already ended (timed out). */
  private settle(race: Race): boolean {
    if (race.done) return false;
    race.done = true;
    if (!Number.isNaN(race.deadline)) this.remove(race);
    return true;
  }

  /** Takes a race off the list. */
  private remove(race: Race): void {
    if (race.prev === undefined) this.head = race.next;
    else race.prev.next = race.next;
    if (race.next === undefined) this.tail = race.prev;
    else race.next.prev = race.prev;
    race.prev = race.next = undefined;
  }

  private arm(delay: number): void {
    // Unref'd: a pending decision must not be what keeps a process alive (its socket does that).
    this.timer = setTimeout(this.fire, delay).unref();
  }

  private readonly fire = (): void => {
    setImmediate(this.expire, this.clock());
  };

  private readonly expire = (firedAt: number): void => {
    while (this.head !== undefined && this.head.deadline <= firedAt) {
      const race = this.head;
      race.done = true;
      this.remove(race);
      race.reject(new RateLimitTimeoutError(this.ms));
    }
    this.timer = undefined;
    if (this.head === undefined) return;
    const now = this.clock();
    // A deadline that passed while this expiry waited for the poll phase (decisions written a moment
    // after the ones that expired): declared at the next check phase, after pending I/O has been read
    // once more, as the rule above wants; a timer, even of 1 ms, would first put the loop to sleep, and
    // a process beside other CPU-bound work may wait long to be woken. Not unref'd: an unref'd immediate
    // does not keep the loop from sleeping in its poll, so in a process with nothing else to do it ran
    // only when some other timer or I/O woke the loop (hundreds of ms late); this one runs in the next turn.
    if (this.head.deadline <= now) this.timer = setImmediate(this.expire, now);
    else this.arm(Math.max(1, Math.ceil(this.head.deadline - now)));
  };
}
