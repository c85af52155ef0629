import { getEventListeners } from 'node:events';
import { Test, type TestingModule } from '@nestjs/testing';
import { Redis } from 'ioredis';
import { BucketService, RateLimitModule } from 'nest-redis-rate-limit';
import { redisUrl } from '../../support/redis.js';
import { redisScenario } from '../../support/scenario.js';

/**
 * Issue 32, items 5 and 9: an abort while the reservation is on its way to Redis, a call after the
 * application closed, and many waits on one AbortSignal.
 */
const SLOW = { capacity: 2, refillPerSecond: 1 };

async function stored(client: Redis, key: string): Promise<{ tokens: number; ts: number }> {
  const [tokens, ts] = await client.hmget(key, 'tokens', 'ts');
  return { tokens: Number(tokens), ts: Number(ts) };
}

describe('acquire(): aborts and the end of the application', () => {
  const scenario = redisScenario('acquire-abort');
  let moduleRef: TestingModule | undefined;
  let buckets: BucketService;
  let prefix: string;

  beforeEach(async () => {
    prefix = scenario.nextKeyPrefix();
    moduleRef = await Test.createTestingModule({
      imports: [RateLimitModule.forRoot({ redis: await redisUrl(), keyPrefix: prefix })],
    }).compile();
    moduleRef.useLogger(false);
    await moduleRef.init();
    buckets = moduleRef.get(BucketService);
  });

  afterEach(async () => {
    await moduleRef?.close();
    moduleRef = undefined;
  });

  it('rejects a call aborted while its reservation is in flight, and gives the reservation back', async () => {
    const key = `${prefix}{in-flight}`;
    // Empty the bucket, so that the next call reserves a token below zero and would wait a second.
    await buckets.acquire('in-flight', SLOW, { cost: 2 });
    const before = await stored(scenario.client, key);
    const controller = new AbortController();
    const call = buckets.acquire('in-flight', SLOW, { signal: controller.signal });
    // Aborted in the same turn: the script call is written, its answer not yet read.
    controller.abort(new Error('client went away'));
    await expect(call).rejects.toMatchObject({ name: 'AbortError', cause: new Error('client went away') });
    // The give-back follows the rejection: wait until Redis has it.
    await new Promise((resolve) => setTimeout(resolve, 50));
    const after = await stored(scenario.client, key);
    // The token reserved came back (it was the last reservation): only the refill between the writes moved the count.
    expect(after.tokens - before.tokens - (after.ts - before.ts) / 1000).toBeCloseTo(0, 9);
  });

  it('rejects a call aborted in flight whose tokens were there, and gives them back', async () => {
    const key = `${prefix}{in-flight-now}`;
    const controller = new AbortController();
    const call = buckets.acquire('in-flight-now', SLOW, { signal: controller.signal });
    controller.abort();
    await expect(call).rejects.toMatchObject({ name: 'AbortError' });
    await new Promise((resolve) => setTimeout(resolve, 50));
    // Full again: 2 - 1 + 1.
    expect((await stored(scenario.client, key)).tokens).toBe(2);
  });

  it('refuses acquire() after the application closed, at once, reserving nothing (a client the application keeps)', async () => {
    // The application's own client stays open after the module closes: a call that went on to Redis would reserve.
    const client = new Redis(await redisUrl(), { enableOfflineQueue: false, lazyConnect: true });
    await client.connect();
    const own = await Test.createTestingModule({ imports: [RateLimitModule.forRoot({ redis: client, keyPrefix: prefix })] }).compile();
    own.useLogger(false);
    await own.init();
    const service = own.get(BucketService);
    await own.close();
    try {
      await expect(service.acquire('after-close', SLOW)).rejects.toMatchObject({ code: 'ERR_RATE_LIMIT_SHUTTING_DOWN' });
      expect(await scenario.client.exists(`${prefix}{after-close}`)).toBe(0);
    } finally {
      client.disconnect();
    }
  });

  it('waits 11 calls on one AbortSignal with one listener on it (no MaxListenersExceededWarning), and aborts them all', async () => {
    const warnings: Error[] = [];
    const onWarning = (warning: Error) => warnings.push(warning);
    process.on('warning', onWarning);
    try {
      await buckets.acquire('shared-signal', SLOW, { cost: 2 });
      const controller = new AbortController();
      const calls = Array.from({ length: 11 }, () =>
        buckets.acquire('shared-signal', { capacity: 2, refillPerSecond: 1 }, { signal: controller.signal }).catch((e: unknown) => e),
      );
      await new Promise((resolve) => setTimeout(resolve, 50));
      expect(getEventListeners(controller.signal, 'abort')).toHaveLength(1);
      controller.abort();
      const outcomes = await Promise.all(calls);
      expect(outcomes.map((e) => (e as Error).name)).toEqual(Array<string>(11).fill('AbortError'));
      await new Promise((resolve) => setImmediate(resolve));
      expect(warnings.filter((w) => w.name === 'MaxListenersExceededWarning')).toEqual([]);
    } finally {
      process.off('warning', onWarning);
    }
  });
});
