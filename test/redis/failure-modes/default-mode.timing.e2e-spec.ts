import { performance } from 'node:perf_hooks';
import type { INestApplication } from '@nestjs/common';
import { Test, type TestingModule } from '@nestjs/testing';
import { BucketService, RateLimitModule } from 'nest-redis-rate-limit';
import { createApp } from '../../support/app.js';
import { type Answer, timedGet } from '../../support/load.js';
import { LogRecorder } from '../../support/log-recorder.js';
import { freePort, RedisServer, testPrefix } from '../../support/redis.js';
import { failureAppModule } from './app.module.js';
import { CAPACITY, REFILL_PER_SECOND } from './failure.controller.js';

/**
 * Issue 32, item 6: with DEFAULT options (no failureMode given) an outage never makes the API
 * unlimited. The default is 'local': the in-process bucket with the route's own policy, so one
 * instance admits at most B + R·t of a client's requests in t seconds while Redis is unreachable,
 * frozen or killed, and a Redis that is not reachable at start-up is one error-level line.
 * Under the old default ('open') every request of these bursts was admitted, without headers.
 */

/** Requests of one client in a row: more than CAPACITY + REFILL_PER_SECOND · t for any burst shorter than 30 s. */
const REQUESTS = CAPACITY + 15;

/** `n` requests one after the other with one API key. */
async function burst(url: string, apiKey: string, n = REQUESTS): Promise<Answer[]> {
  const answers: Answer[] = [];
  for (let i = 0; i < n; i++) answers.push(await timedGet(url, { 'x-api-key': apiKey }));
  return answers;
}

/**
 * The burst was limited by the route's policy on this instance: at most B + floor(R·t) admitted in the
 * t seconds from its first request to its last answer (a fresh key's bucket starts full), the first B
 * admitted with the local bucket's numbers, and every other answer a 429 with a Retry-After.
 */
function expectLimitedOnOneInstance(answers: readonly Answer[]): void {
  const seconds = (answers[answers.length - 1].endedAt - answers[0].startedAt) / 1000;
  const bound = CAPACITY + Math.floor(REFILL_PER_SECOND * seconds);
  const statuses = answers.map((a) => a.status);
  const admitted = statuses.filter((s) => s === 200).length;
  expect({ admitted, seconds, atMost: bound }).toEqual({ admitted: Math.min(admitted, bound), seconds, atMost: bound });
  expect(statuses.filter((s) => s !== 200 && s !== 429)).toEqual([]);
  expect(statuses.slice(0, CAPACITY)).toEqual(Array(CAPACITY).fill(200));
  expect(answers.slice(0, CAPACITY).map((a) => a.limit)).toEqual(Array(CAPACITY).fill(String(CAPACITY)));
  // At least REQUESTS - bound refused: 15 of 25 unless the burst took longer than 2 s.
  const refused = answers.filter((a) => a.status === 429);
  expect(refused.length).toBe(REQUESTS - admitted);
  expect(refused.length).toBeGreaterThanOrEqual(REQUESTS - bound);
  for (const a of refused) expect(Number(a.retryAfter)).toBeGreaterThanOrEqual(1);
}

/** The app of ./failure.controller.ts with default options but the Redis URL and a key prefix. */
async function startApp(redis: string, prefix: string, recorder: LogRecorder): Promise<{ app: INestApplication; url: string }> {
  const app = await createApp(failureAppModule({ redis, keyPrefix: prefix }), 'express', (nest) => nest.useLogger(recorder));
  await app.listen(0, '127.0.0.1');
  return { app, url: `${(await app.getUrl()).replace('[::1]', '127.0.0.1')}/limited` };
}

/** The start-up line of a Redis the app could not reach, with the default failure mode in it. */
const startupLine = (port: number, cause: string) =>
  `Redis at 127.0.0.1:${port} is not reachable at start-up: ${cause}; starting anyway: decisions follow failureMode 'local' until it answers`;

describe('default options while Redis is out: the in-process bucket limits, never an unlimited API', () => {
  let app: INestApplication | undefined;
  let server: RedisServer | undefined;

  afterEach(async () => {
    try {
      await app?.close();
    } finally {
      app = undefined;
      await server?.stop();
      server = undefined;
    }
  });

  it('nothing listens on the Redis port at start-up: one error line, then at most B + R·t of a burst admitted', async () => {
    const recorder = new LogRecorder();
    const port = await freePort();
    let url: string;
    ({ app, url } = await startApp(`redis://127.0.0.1:${port}`, testPrefix('default-mode-refused'), recorder));
    expect(recorder.of('RateLimit', 'error')).toEqual([startupLine(port, `connection refused (connect ECONNREFUSED 127.0.0.1:${port})`)]);
    expectLimitedOnOneInstance(await burst(url, 'refused-at-start'));
  });

  it('a frozen redis-server (SIGSTOP) at start-up: one error line, then at most B + R·t of a burst admitted', async () => {
    const recorder = new LogRecorder();
    server = await RedisServer.start();
    server.signal('SIGSTOP');
    let url: string;
    ({ app, url } = await startApp(server.url, testPrefix('default-mode-frozen'), recorder));
    expect(recorder.of('RateLimit', 'error')).toEqual([startupLine(server.port, 'no answer within 1000 ms')]);
    expectLimitedOnOneInstance(await burst(url, 'frozen-at-start'));
    // Close while it is still frozen: the teardown kills it (SIGCONT first).
    await app.close();
    app = undefined;
  });

  it('redis-server killed while the app runs: the warning names the in-process buckets, and at most B + R·t is admitted', async () => {
    const recorder = new LogRecorder();
    server = await RedisServer.start();
    let url: string;
    ({ app, url } = await startApp(server.url, testPrefix('default-mode-killed'), recorder));
    expect(recorder.of('RateLimit', 'error')).toEqual([]);
    // Redis decides while it lives: a fresh key's bucket in Redis says CAPACITY - 1.
    expect((await timedGet(url, { 'x-api-key': 'before-kill' })).remaining).toBe(String(CAPACITY - 1));
    await server.stop();
    expectLimitedOnOneInstance(await burst(url, 'after-kill'));
    const failed = recorder.of('RateLimit', 'warn').filter((w) => w.startsWith('Rate-limit store failed'));
    expect(failed.length).toBeGreaterThanOrEqual(1);
    expect(failed[0]).toMatch(/; requests are limited by in-process buckets until it answers again \(failureMode 'local'\)$/);
  });
});

describe("acquire() with default options while Redis is unreachable follows the module's default, 'local'", () => {
  let moduleRef: TestingModule | undefined;

  afterEach(async () => {
    await moduleRef?.close();
    moduleRef = undefined;
  });

  it("waits its turn in the process's own bucket: 6 calls at B = 2, R = 10/s go at 2 + 10·t at most, the last about 400 ms after the first", async () => {
    const recorder = new LogRecorder();
    const port = await freePort();
    moduleRef = await Test.createTestingModule({
      imports: [RateLimitModule.forRoot({ redis: `redis://127.0.0.1:${port}`, keyPrefix: testPrefix('default-mode-acquire') })],
    })
      .setLogger(recorder)
      .compile();
    await moduleRef.init();
    expect(recorder.of('RateLimit', 'error')).toEqual([startupLine(port, `connection refused (connect ECONNREFUSED 127.0.0.1:${port})`)]);
    const buckets = moduleRef.get(BucketService);
    const policy = { capacity: 2, refillPerSecond: 10 };
    const started = performance.now();
    const wentAt: number[] = [];
    const decisions = await Promise.all(
      Array.from({ length: 6 }, () =>
        buckets.acquire('paced', policy).then((decision) => {
          wentAt.push(performance.now() - started);
          return decision;
        }),
      ),
    );
    // Turns on the in-process bucket's clock: the first two at once, then one per 100 ms.
    const turns = decisions.map((d) => d.turnAt);
    expect(turns.every((t) => typeof t === 'number')).toBe(true);
    const sorted = (turns as number[]).slice().sort((a, b) => a - b);
    for (let i = 0; i < sorted.length; i++) {
      for (let j = i; j < sorted.length; j++) {
        // The whole ms of the memory store's clock: one turn may read up to 1 ms early.
        expect(j - i + 1).toBeLessThanOrEqual(policy.capacity + (policy.refillPerSecond * (sorted[j] - sorted[i] + 1)) / 1000 + 1e-9);
      }
    }
    expect(sorted[5] - sorted[0]).toBeGreaterThanOrEqual(400 - 2);
    const waits = decisions.map((d) => d.scheduledWaitMs).sort((a, b) => a - b);
    expect(waits.slice(0, 2)).toEqual([0, 0]);
    expect(waits[5]).toBeGreaterThan(350);
    // Nobody went before their turn came: the last call resolved at least ~400 ms after the calls began.
    expect(Math.max(...wentAt)).toBeGreaterThanOrEqual(400 - 5);
  });
});
