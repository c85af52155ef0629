import { Logger } from '@nestjs/common';
import { Test, type TestingModule } from '@nestjs/testing';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { BucketService, RateLimitModule, type RateLimitModuleOptions } from 'nest-redis-rate-limit';
import { LogRecorder } from '../../support/log-recorder.js';
import { RedisServer } from '../../support/redis.js';

/**
 * Issue 10, item 3: the in-process stores (`store: 'memory'` and the `failureMode: 'local'` fallback)
 * hold at most `maxLocalBuckets` buckets, and the fallback is emptied when Redis answers again.
 */
const logs = new LogRecorder();
const policy = { capacity: 2, refillPerSecond: 0.01 }; // drained by one consume(…, 2); refills in 200 s

async function started(options: RateLimitModuleOptions): Promise<{ moduleRef: TestingModule; buckets: BucketService }> {
  const moduleRef = await Test.createTestingModule({ imports: [RateLimitModule.forRoot(options)] }).compile();
  // After compile(), which installs Nest's default logger.
  Logger.overrideLogger(logs);
  await moduleRef.init();
  return { moduleRef, buckets: moduleRef.get(BucketService) };
}

/**
 * Drains the buckets `from`..`to - 1`, each of which must have been full, `batch` calls at a time. In an
 * outage, calls one after another are each the breaker's probe and ask the stopped Redis first; calls
 * made together, as a loaded app makes them, send one probe and decide the others locally at once.
 */
async function drain(buckets: BucketService, from: number, to: number, batch = 1): Promise<void> {
  const one = async (i: number) => {
    const decision = await buckets.consume(`id-${i}`, policy, 2);
    if (!decision.allowed) throw new Error(`id-${i} was refused: it should have been full`);
  };
  for (let i = from; i < to; i += batch) {
    await Promise.all(Array.from({ length: Math.min(batch, to - i) }, (_, j) => one(i + j)));
  }
}

const full = async (buckets: BucketService, i: number) => (await buckets.consume(`id-${i}`, policy, 2)).allowed;

describe('in-process buckets are bounded', () => {
  afterEach(() => logs.clear());

  it("store: 'memory' forgets the least recently used beyond maxLocalBuckets, and says so once", async () => {
    const { moduleRef, buckets } = await started({ store: 'memory', maxLocalBuckets: 1000 });
    try {
      await drain(buckets, 0, 2000);
      expect(await full(buckets, 1999)).toBe(false); // held, drained (a refusal writes nothing)
      expect(await full(buckets, 1000)).toBe(false);
      expect(await full(buckets, 999)).toBe(true); // forgotten: starts full again
      const warnings = logs.of('RateLimit', 'warn').filter((line) => line.includes('maxLocalBuckets'));
      expect(warnings).toHaveLength(1);
      expect(warnings[0]).toContain("More than 1000 buckets are in use in this process (store: 'memory')");
    } finally {
      await moduleRef.close();
    }
  });

  it("failureMode: 'local' holds at most maxLocalBuckets during an outage and forgets them when Redis answers again", async () => {
    const server = await RedisServer.start();
    const { moduleRef, buckets } = await started({
      redis: server.url,
      keyPrefix: 'memory-bounds:',
      failureMode: 'local',
      maxLocalBuckets: 1000,
      timeoutMs: 200,
      denyCache: false,
    });
    try {
      await server.stop();
      await drain(buckets, 0, 2000);
      expect(buckets.storeFailing).toBe(true);
      expect(await full(buckets, 1999)).toBe(false);
      expect(await full(buckets, 500)).toBe(true); // forgotten beyond the bound
      expect(logs.of('RateLimit', 'warn').some((line) => line.includes("(failureMode: 'local')"))).toBe(true);

      // Redis answers again: its buckets (all full: it never saw these) are the truth.
      await server.start();
      await waitUntil(async () => {
        await buckets.peek('id-1999', policy);
        return !buckets.storeFailing;
      });
      expect(await full(buckets, 1999)).toBe(true);

      // The next outage starts from empty in-process buckets, not from the last outage's.
      await server.stop();
      expect(await full(buckets, 1998)).toBe(true);
      expect(buckets.storeFailing).toBe(false); // one failure: decided locally, the breaker not yet open
      expect(await full(buckets, 1997)).toBe(true);
      expect(await full(buckets, 1998)).toBe(false); // the in-process bucket of this outage
    } finally {
      await moduleRef.close();
      await server.stop();
    }
  });

  it('300,000 identities in an outage: the heap stops growing at the default bound of 100,000', async () => {
    setFlagsFromString('--expose-gc');
    const gc = runInNewContext('gc') as () => void;
    const heap = () => {
      gc();
      gc();
      return process.memoryUsage().heapUsed;
    };
    const server = await RedisServer.start();
    const { moduleRef, buckets } = await started({ redis: server.url, failureMode: 'local', timeoutMs: 200, denyCache: false });
    try {
      await server.stop();
      await drain(buckets, -10, 0); // the breaker is open before measuring
      const before = heap();
      const growth: number[] = [];
      for (let n = 0; n < 300_000; n += 100_000) {
        await drain(buckets, n, n + 100_000, 1_000);
        growth.push(heap() - before);
      }
      const mib = (bytes: number) => `${(bytes / 2 ** 20).toFixed(1)} MiB`;
      console.log(
        `failureMode 'local', heap growth after 100,000 / 200,000 / 300,000 identities: ${growth.map(mib).join(' / ')} ` +
          `(${Math.round(growth[0] / 100_000)} B per bucket at the bound)`,
      );
      expect(growth[0]).toBeGreaterThan(100_000 * 50); // the buckets are there: at least 50 B each
      // The Map's table grows once when the first evictions leave deleted slots, then stays: the third
      // 100,000 add (almost) nothing. Unbounded, each 100,000 would add as much as the first.
      expect(growth[2] - growth[1]).toBeLessThan(growth[0] * 0.15);
      expect(growth[2]).toBeLessThan(growth[0] * 2);
      expect(await full(buckets, 299_999)).toBe(false);
      expect(await full(buckets, 199_999)).toBe(true);
    } finally {
      await moduleRef.close();
      await server.stop();
    }
    // A hang catcher only: 300,000 decisions took 20 to 50 s beside 4 CPU-bound processes.
  }, 120_000);
});

async function waitUntil(condition: () => Promise<boolean>, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error('condition not met in time');
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}
