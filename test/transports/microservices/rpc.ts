import type { ClientProxy } from '@nestjs/microservices';
import { firstValueFrom } from 'rxjs';

/**
 * What a refused `ClientProxy.send()` errors with (README "Microservices"): a bucket of capacity B
 * refilled at 0.01/s, drained, has its next token 100 s away.
 */
export const RATE_LIMITED = { status: 'error', code: 'RATE_LIMITED', message: 'Too Many Requests', retryAfter: 100 };
export const UNAVAILABLE = {
  status: 'error',
  code: 'RATE_LIMIT_UNAVAILABLE',
  message: 'Rate limiting is unavailable; try again shortly',
  retryAfter: 1,
};

/** One `send()`'s end: the handler's answer, or the error the caller's observable gave. */
export type Outcome = { answer: unknown } | { error: unknown };

export const answers = (outcomes: Outcome[]): unknown[] => outcomes.flatMap((o) => ('answer' in o ? [o.answer] : []));
export const errors = (outcomes: Outcome[]): unknown[] => outcomes.flatMap((o) => ('error' in o ? [o.error] : []));

/** `client.send(pattern, data)` for each payload, all at once; each settled (a refusal does not reject the batch). */
export function sendAll(client: ClientProxy, pattern: unknown, payloads: unknown[], timeoutMs = 5000): Promise<Outcome[]> {
  return Promise.all(
    payloads.map((data) =>
      withTimeout(firstValueFrom(client.send(pattern, data)), timeoutMs, `send(${JSON.stringify(pattern)})`).then(
        (answer): Outcome => ({ answer }),
        (error: unknown): Outcome => ({ error }),
      ),
    ),
  );
}

/** `n` copies of `data` (or `data(i)`). */
export const times = (n: number, data: unknown | ((i: number) => unknown)): unknown[] =>
  Array.from({ length: n }, (_, i) => (typeof data === 'function' ? (data as (i: number) => unknown)(i) : data));

/** `payload.retryAfter` is an integer of at least 1, as the README promises for every wait. */
export function expectWholeSeconds(payload: unknown): void {
  const { retryAfter } = payload as { retryAfter?: unknown };
  expect(Number.isInteger(retryAfter)).toBe(true);
  expect(retryAfter as number).toBeGreaterThanOrEqual(1);
}

/** Resolves once `count()` reaches `n`, then waits `settleMs` more so that an extra arrival would show; rejects after `timeoutMs`. */
export async function until(count: () => number, n: number, what: string, timeoutMs = 5000, settleMs = 200): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (count() < n) {
    if (Date.now() > deadline) throw new Error(`waited ${timeoutMs} ms for ${n} ${what}, got ${count()}`);
    await new Promise((r) => setTimeout(r, 10));
  }
  await new Promise((r) => setTimeout(r, settleMs));
}

/** A promise that rejects after `ms` instead of hanging the test until jest's timeout. */
function withTimeout<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: no answer within ${ms} ms`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}
