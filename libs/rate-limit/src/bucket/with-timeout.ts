/** A store decision took longer than `timeoutMs`. */
export class RateLimitTimeoutError extends Error {
  constructor(timeoutMs: number) {
    super(`rate-limit decision took longer than ${timeoutMs} ms`);
    this.name = 'RateLimitTimeoutError';
  }
}

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

/** One promise racing its deadline: a node of the `Deadlines` list while it is pending. */
interface Race {
  deadline: number;
  reject: (error: unknown) => void;
  prev: Race | undefined;
  next: Race | undefined;
}

/**
 * `withTimeout` for a stream of promises that share one timeout, as every decision of a module does.
 * Their deadlines come in the order the promises do, so the pending ones form a list in deadline order
 * and one timer, armed for the oldest, serves them all: no timer is created or cleared per decision,
 * and a race leaves the list the moment its promise settles (nothing outlives it but garbage). A
 * deadline is declared, as in `withTimeout`, only after pending I/O has been read once more
 * (`setImmediate`).
 */
export class Deadlines {
  private head: Race | undefined;
  private tail: Race | undefined;
  private timer: NodeJS.Timeout | undefined;

  constructor(
    private readonly ms: number,
    private readonly clock: () => number = () => performance.now(),
  ) {}

  /** Settles like `promise`, or rejects with `RateLimitTimeoutError` once `ms` have passed. */
  race<T>(promise: Promise<T>): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      const race: Race = { deadline: this.clock() + this.ms, reject, prev: this.tail, next: undefined };
      if (this.tail === undefined) this.head = race;
      else this.tail.next = race;
      this.tail = race;
      if (this.timer === undefined) this.arm(this.ms);
      promise.then(
        (value) => {
          if (this.remove(race)) resolve(value);
        },
        (error: unknown) => {
          if (this.remove(race)) reject(error);
        },
      );
    });
  }

  /** Takes a race off the list; false when it had already left it (timed out). */
  private remove(race: Race): boolean {
    if (race.prev === undefined && this.head !== race) return false;
    if (race.prev === undefined) this.head = race.next;
    else race.prev.next = race.next;
    if (race.next === undefined) this.tail = race.prev;
    else race.next.prev = race.prev;
    race.prev = race.next = undefined;
    return true;
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
      this.remove(race);
      race.reject(new RateLimitTimeoutError(this.ms));
    }
    this.timer = undefined;
    if (this.head !== undefined) this.arm(Math.max(1, Math.ceil(this.head.deadline - this.clock())));
  };
}
