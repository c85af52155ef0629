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

/** One promise racing its deadline in a `Deadlines` queue. */
interface Race {
  deadline: number;
  settled: boolean;
  reject: (error: unknown) => void;
}

/** Settled races kept at the front of the queue before it is compacted. */
const COMPACT_AFTER = 1024;

/**
 * `withTimeout` for a stream of promises that share one timeout, as every decision of a module does.
 * Their deadlines come in the order the promises do, so one timer, armed for the oldest deadline still
 * pending, serves them all: no timer is created or cleared per decision. A deadline is declared, as in
 * `withTimeout`, only after pending I/O has been read once more (`setImmediate`).
 */
export class Deadlines {
  private queue: Race[] = [];
  private head = 0;
  private timer: NodeJS.Timeout | undefined;

  constructor(
    private readonly ms: number,
    private readonly clock: () => number = () => performance.now(),
  ) {}

  /** Settles like `promise`, or rejects with `RateLimitTimeoutError` once `ms` have passed. */
  race<T>(promise: Promise<T>): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      const race: Race = { deadline: this.clock() + this.ms, settled: false, reject };
      this.queue.push(race);
      if (this.timer === undefined) this.arm(this.ms);
      promise.then(
        (value) => {
          if (race.settled) return;
          race.settled = true;
          resolve(value);
        },
        (error: unknown) => {
          if (race.settled) return;
          race.settled = true;
          reject(error);
        },
      );
    });
  }

  private arm(delay: number): void {
    // Unref'd: a pending decision must not be what keeps a process alive (its socket does that).
    this.timer = setTimeout(this.fire, delay).unref();
  }

  private readonly fire = (): void => {
    setImmediate(this.expire, this.clock());
  };

  private readonly expire = (firedAt: number): void => {
    const queue = this.queue;
    let i = this.head;
    for (; i < queue.length; i++) {
      const race = queue[i];
      if (race.settled) continue;
      if (race.deadline > firedAt) break;
      race.settled = true;
      race.reject(new RateLimitTimeoutError(this.ms));
    }
    if (i === queue.length) {
      this.queue = [];
      this.head = 0;
      this.timer = undefined;
      return;
    }
    if (i >= COMPACT_AFTER) {
      this.queue = queue.slice(i);
      this.head = 0;
    } else {
      this.head = i;
    }
    this.arm(Math.max(1, Math.ceil(this.queue[this.head].deadline - this.clock())));
  };
}
