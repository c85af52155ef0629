import type { INestApplication } from '@nestjs/common';
import { Redis } from 'ioredis';
import type { FailureMode } from 'nest-redis-rate-limit';
import { expectCountdown } from '../../support/countdown.js';
import { type Answer, sleep, timedGet } from '../../support/load.js';
import { tokensOf } from '../../support/redis.js';
import { bucketKey } from './app.module.js';
import { CAPACITY, REFILL_PER_SECOND } from './failure.controller.js';
import { pairedGet } from './timing.js';

/** Every failure scenario runs under each failure mode. */
export const MODES: readonly FailureMode[] = ['open', 'closed', 'local'];

/**
 * Short enough to keep the files fast, long enough for a decision on a busy 2-core machine, and for the
 * bounds of timing.ts to tell a decision that waited twice as long (SLACK_MS + LOOP_LIMIT_MS < 100).
 */
export const TIMEOUT_MS = 100;

/** Background load: 16 request loops, each pausing 40 ms between answer and next request. */
export const WORKERS = 16;
export const THINK_MS = 40;
/**
 * A fresh API key per request: every one is a decision Redis must make while it lives (a drained key
 * would be denied in process by the deny cache, and never reach Redis).
 */
export const freshKeys = (label: string) => (n: number) => ({ 'x-api-key': `${label}-${n}` });

/**
 * Listens on a free loopback port and returns the limited route's URL, after a few rounds of
 * concurrent requests (to it and to the control route) so that connections are open and code is warm
 * before anything is timed.
 */
export async function limitedUrl(app: INestApplication): Promise<string> {
  await app.listen(0, '127.0.0.1');
  const url = `${(await app.getUrl()).replace('[::1]', '127.0.0.1')}/limited`;
  for (let round = 0; round < 3; round++) {
    await Promise.all(Array.from({ length: WORKERS }, (_, i) => pairedGet(url, { 'x-api-key': `warm-up-${i}` })));
  }
  return url;
}

/** `n` requests one after the other with one API key. */
export async function burst(url: string, apiKey: string, n: number): Promise<Answer[]> {
  const answers: Answer[] = [];
  for (let i = 0; i < n; i++) answers.push(await timedGet(url, { 'x-api-key': apiKey }));
  return answers;
}

/** A connected client for checking what the app wrote; quiet while its server is down. */
export async function inspector(url: string): Promise<Redis> {
  const client = new Redis(url, { maxRetriesPerRequest: 0, enableOfflineQueue: false, lazyConnect: true });
  client.on('error', () => undefined);
  await client.connect();
  return client;
}

/**
 * Sends a request every 50 ms until Redis holds the bucket it drains, i.e. until Redis decides again;
 * returns how long that took (ms). Fails after `withinMs`.
 */
export async function untilRedisDecides(url: string, client: Redis, prefix: string, withinMs = 6_000): Promise<number> {
  const started = Date.now();
  for (let i = 0; Date.now() - started < withinMs; i++) {
    const apiKey = `probe-${i}`;
    await timedGet(url, { 'x-api-key': apiKey });
    if (client.status === 'ready' && (await client.exists(bucketKey(prefix, apiKey))) === 1) {
      return Date.now() - started;
    }
    await sleep(50);
  }
  throw new Error(`Redis did not decide again within ${withinMs} ms`);
}

/** What a fresh API key's burst of CAPACITY + 3 gets while the store is failing, per mode. */
export function expectOutageBurst(mode: FailureMode, answers: readonly Answer[]): void {
  const statuses = answers.map((a) => a.status);
  if (mode === 'open') {
    // Allowed without a decision, so no numbers worth sending.
    expect(statuses).toEqual(answers.map(() => 200));
    expect(answers.map((a) => a.remaining)).toEqual(answers.map(() => null));
  } else if (mode === 'closed') {
    expect(statuses).toEqual(answers.map(() => 503));
    expect(answers.map((a) => a.retryAfter)).toEqual(answers.map(() => '1'));
    expect(JSON.parse(answers[0].body ?? '')).toEqual({
      statusCode: 503,
      message: 'Rate limiting is unavailable; try again shortly',
      error: 'Service Unavailable',
    });
  } else {
    // The in-process bucket enforces the same policy: the burst, then 429 with Retry-After ceil(1 / 0.5).
    // It refills from the burst's first request (a fresh key's bucket is full until then), so a burst
    // that took T s may admit floor(R·T) more: exactly CAPACITY when it took under 1 / R = 2 s (the usual
    // run), and each refusal's wait counts down from that first request.
    const burstSeconds = (answers[answers.length - 1].endedAt - answers[0].startedAt) / 1000;
    const refilled = Math.floor(REFILL_PER_SECOND * burstSeconds);
    const admitted = statuses.filter((s) => s === 200).length;
    expect(statuses.slice(0, CAPACITY)).toEqual(Array(CAPACITY).fill(200));
    expect(statuses.slice(CAPACITY).filter((s) => s !== 200 && s !== 429)).toEqual([]);
    // With the first CAPACITY allowed and nothing but 200 or 429 after them, exact when nothing refilled.
    expect({ admitted, burstSeconds }).toEqual({ admitted: Math.min(admitted, CAPACITY + refilled), burstSeconds });
    answers.slice(0, CAPACITY).forEach((a, i) => {
      const remaining = Number(a.remaining);
      expect(remaining).toBeGreaterThanOrEqual(CAPACITY - 1 - i);
      expect(remaining).toBeLessThanOrEqual(CAPACITY - 1 - i + refilled);
    });
    const refused = answers.filter((a) => a.status === 429);
    for (const a of refused) expectCountdown(a.retryAfter, 1 / REFILL_PER_SECOND, answers[0].startedAt, a.endedAt);
    if (refused.length > 0) {
      expect(JSON.parse(refused[0].body ?? '')).toEqual({
        statusCode: 429,
        message: 'Too Many Requests',
        retryAfter: Number(refused[0].retryAfter),
      });
    }
  }
}

/** After recovery a fresh key's burst is decided by Redis again: CAPACITY allowed, then 429, and the bucket is in Redis. */
export async function expectRedisLimitsBurst(url: string, client: Redis, prefix: string, apiKey: string): Promise<void> {
  const answers = await burst(url, apiKey, CAPACITY + 3);
  expect(answers.map((a) => a.status)).toEqual([...Array(CAPACITY).fill(200), 429, 429, 429]);
  // A token every 2 s: '2' when the burst was quick, less by the seconds it took (a loaded machine: '1').
  expectCountdown(answers[CAPACITY].retryAfter, 1 / REFILL_PER_SECOND, answers[0].startedAt, answers[CAPACITY].endedAt);
  expect(Number(answers[CAPACITY].retryAfter)).toBeGreaterThanOrEqual(1);
  const tokens = await tokensOf(client, bucketKey(prefix, apiKey));
  expect(tokens).toBeGreaterThanOrEqual(0);
  expect(tokens).toBeLessThan(1);
}

/** Prints a measured figure when RL_TEST_FIGURES is set (for the notes), silent otherwise. */
export function figure(label: string, value: number | string): void {
  if (process.env.RL_TEST_FIGURES) process.stdout.write(`[figure] ${label}: ${value}\n`);
}
