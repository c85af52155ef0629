import { performance } from 'node:perf_hooks';
import { Redis } from 'ioredis';
import { PLATFORMS } from '../../support/app.js';
import { buildWorkerApp, LoadDriver, startWorkers, stopAll, type Worker, type WorkerBuild } from '../../support/processes.js';
import { deleteKeys, redisUrl, testPrefix } from '../../support/redis.js';
import { B, R, SLOW } from '../../support/worker-app/worker.controller.js';

/**
 * Two app instances whose clocks (Date.now) are 10 minutes apart share buckets correctly, because
 * the script reads Redis TIME. Had it used the app clock, the instance ahead would see 10 minutes of
 * refill in a bucket the one behind just drained, and the one behind would see no refill at all in a
 * bucket the one ahead drained.
 */
const AHEAD_MS = 7 * 60_000;
const BEHIND_MS = -3 * 60_000;

let build: WorkerBuild;

beforeAll(async () => {
  build = await buildWorkerApp();
}, 60_000);

afterAll(async () => {
  await build?.remove();
});

describe.each(PLATFORMS)('two %s instances with clocks 10 minutes apart', (platform) => {
  const prefix = testPrefix(`clock-skew-${platform}`);
  let client: Redis;
  let ahead: Worker;
  let behind: Worker;
  let driver: LoadDriver;

  beforeAll(async () => {
    const url = await redisUrl();
    client = new Redis(url);
    // If one fails to start, the other is stopped before this rejects.
    [ahead, behind] = await startWorkers(build.entry, [
      { redisUrl: url, keyPrefix: prefix, platform, clockSkewMs: AHEAD_MS },
      { redisUrl: url, keyPrefix: prefix, platform, clockSkewMs: BEHIND_MS },
    ]);
    driver = new LoadDriver([ahead.url, behind.url], 16);
    await driver.drive('/ping', {}, 200);
  }, 60_000);

  afterAll(async () => {
    driver?.close();
    try {
      await stopAll([ahead, behind]);
    } finally {
      await deleteKeys(client, prefix);
      await client.quit();
    }
  }, 30_000);

  it('runs the two instances with Date.now() 10 minutes apart', async () => {
    const [a, b] = await Promise.all([driver.get(ahead.url, '/ping'), driver.get(behind.url, '/ping')]);
    const difference = JSON.parse(a.body).now - JSON.parse(b.body).now;
    expect(difference).toBeGreaterThan(AHEAD_MS - BEHIND_MS - 5_000);
    expect(difference).toBeLessThan(AHEAD_MS - BEHIND_MS + 5_000);
  });

  it('refuses on the instance ahead a bucket the instance behind drained, with the real Retry-After', async () => {
    const key = { 'x-api-key': 'drained-behind' };
    for (let i = SLOW.capacity - 1; i >= 0; i--) {
      const reply = await driver.get(behind.url, '/slow', key);
      expect(reply.status).toBe(200);
      expect(reply.headers['x-ratelimit-remaining']).toBe(String(i));
    }
    const denied = await driver.get(ahead.url, '/slow', key);
    expect(denied.status).toBe(429);
    expect(denied.headers['x-ratelimit-remaining']).toBe('0');
    // One token at 0.01/s: about 100 s, not a wait shifted by the 10 minutes between the clocks.
    expect(Number(denied.headers['retry-after'])).toBeGreaterThanOrEqual(99);
    expect(Number(denied.headers['retry-after'])).toBeLessThanOrEqual(100);
    expect((await driver.get(behind.url, '/slow', key)).status).toBe(429);
  });

  it('refills on the instance behind a bucket the instance ahead drained, at R tokens per real second', async () => {
    const key = { 'x-api-key': 'drained-ahead' };
    const started = performance.now();
    const burst = await Promise.all(Array.from({ length: B }, () => driver.get(ahead.url, '/single', key)));
    let drained = burst.filter((r) => r.status === 200).length;
    // Then one at a time until the instance ahead is refused: the bucket holds less than a token.
    for (;;) {
      const reply = await driver.get(ahead.url, '/single', key);
      if (reply.status === 429) break;
      drained++;
    }
    await new Promise((r) => setTimeout(r, 500));
    const after = await Promise.all(Array.from({ length: 40 }, () => driver.get(behind.url, '/single', key)));
    const seconds = (performance.now() - started) / 1000;
    const refilled = after.filter((r) => r.status === 200).length;
    // At least the 0.5 s pause's worth came back (10 tokens); never more than the real time allows.
    expect(refilled).toBeGreaterThanOrEqual(R * 0.5 - 1);
    expect(drained + refilled).toBeLessThanOrEqual(B + R * seconds + 1);
  });

  it(`keeps the promise B + R·T + 1 when both instances drive one bucket at once for 3 s`, async () => {
    // T from the first request received to the last response written, on the real clock.
    const { servedSeconds: seconds, perUrl } = await driver.drive('/single', { 'x-api-key': 'driven-by-both' }, 3_000);
    const allowed = perUrl.reduce((n, s) => n + s.allowed, 0);
    for (const stats of perUrl) {
      expect(stats.failed).toEqual([]);
      expect(stats.allowedWithoutDecision).toBe(0);
      expect(stats.allowed).toBeGreaterThan(0);
    }
    expect(allowed).toBeLessThanOrEqual(B + R * seconds + 1);
    expect(allowed).toBeGreaterThanOrEqual(B + R * seconds + 1 - R * 0.25);
  }, 20_000);
});
