import type { INestApplication } from '@nestjs/common';
import { Redis } from 'ioredis';
import { createApp } from '../../support/app.js';
import { RedisServer, testPrefix } from '../../support/redis.js';
import { Loader } from './leased-load.js';
import { leasesAppModule } from './leases.controllers.js';

/**
 * When a bucket is leased on an instance (issue 35): once hot (more than 64 decisions in a row, each
 * within 100 ms of the one before), it stays leased while they come within 250 ms and its demand is 10
 * a second or more, so a demand near the threshold does not flip it between a call per decision and a
 * call per batch; and a slow demand is exact again. Found by the leases bench, with a first rule (200
 * decisions a second over two 100 ms windows): at 250 a second per process, windows of 18-24 decisions
 * made a leased key exact about one window in two (0.097 calls per decision instead of 0.04).
 */
describe('the demand that makes a leased bucket hot, and keeps it so', () => {
  let server: RedisServer;
  let client: Redis;
  let app: INestApplication;
  let url: string;
  const loader = new Loader();
  const keyPrefix = testPrefix('leased-demand');
  const KEY = `${keyPrefix}{id:everyone}:burst`;

  beforeAll(async () => {
    // A server of the test's own: script calls are counted on it.
    server = await RedisServer.start();
    client = new Redis(server.url);
    app = await createApp(leasesAppModule({ redis: server.url, keyPrefix }), 'express');
    await app.listen(0, '127.0.0.1');
    url = await app.getUrl();
  });

  afterAll(async () => {
    await app?.close();
    loader.destroy();
    client?.disconnect();
    await server?.stop();
  });

  /**
   * `perSecond` GETs of `/leased/burst` a second for `ms`, those due sent together every 50 ms. Meanwhile the
   * bucket's hash is read every 20 ms: the share of the reads, after the first `settleMs`, that found a lease
   * in it (an `l:` field; a lease given back or ended is deleted). Script calls cannot tell: exact
   * decisions sent together are coalesced into one call.
   */
  async function paced(perSecond: number, ms: number, settleMs = 300): Promise<{ statuses: number[]; leased: number }> {
    const pending: Promise<{ status: number }>[] = [];
    const started = performance.now();
    const reads: boolean[] = [];
    let sending = true;
    const watching = (async () => {
      while (sending) {
        const fields = await client.hgetall(KEY);
        if (performance.now() - started >= settleMs) reads.push(Object.keys(fields).some((field) => field.startsWith('l:')));
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
    })();
    for (let tick = 1; tick * 50 <= ms; tick++) {
      const due = started + tick * 50;
      await new Promise((resolve) => setTimeout(resolve, Math.max(0, due - performance.now())));
      while (pending.length < Math.floor((tick * perSecond) / 20)) pending.push(loader.get(`${url}/leased/burst`));
    }
    sending = false;
    await watching;
    const answers = await Promise.all(pending);
    return { statuses: answers.map((a) => a.status), leased: reads.filter(Boolean).length / reads.length };
  }

  it('keeps a hot bucket leased at 15 decisions a second (gaps of 50 to 100 ms), and decides it exactly at 5', async () => {
    // Hot: 100 a second for 1 s (more than 64 decisions in a row, 5 every 50 ms).
    const warm = await paced(100, 1_000);
    expect(warm.statuses.every((status) => status === 200)).toBe(true);
    // 15 a second for 1.5 s: leased all along (batches of ⌈15 × 0.25⌉ = 4 tokens, renewed at half).
    const near = await paced(15, 1_500);
    expect(near.statuses.every((status) => status === 200)).toBe(true);
    expect(near.leased).toBeGreaterThanOrEqual(0.8);
    // 5 a second (under half the threshold): exact again after a window, its last lease given back and
    // deleted before its end (500 ms).
    const cold = await paced(5, 1_500, 700);
    expect(cold.statuses.every((status) => status === 200)).toBe(true);
    expect(cold.leased).toBeLessThanOrEqual(0.2);
  }, 30_000);
});
