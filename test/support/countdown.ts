import { performance } from 'node:perf_hooks';

/**
 * A wait a refusal announces (Retry-After, draft-8 't', a body's `retryAfter`) counts down with the
 * refill, which runs from the first request that took the bucket below its capacity: `full` seconds
 * then, ceil(full - T) after T seconds. `since` is read before that request and `at` (default: now)
 * after the refusal was answered, so T here is at least the real one: within a second (the usual run)
 * the bound is exactly `full`; a run slowed by a loaded machine may read less, never more, and never
 * below the bound.
 */
export function expectCountdown(value: unknown, full: number, since: number, at: number = performance.now()): void {
  const seconds = Number(value);
  expect(Number.isInteger(seconds)).toBe(true);
  expect(seconds).toBeLessThanOrEqual(full);
  expect(seconds).toBeGreaterThanOrEqual(Math.ceil(full - (at - since) / 1000));
}
