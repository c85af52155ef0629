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
