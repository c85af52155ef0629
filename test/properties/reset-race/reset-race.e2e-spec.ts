import { Test, type TestingModule } from '@nestjs/testing';
import { Redis } from 'ioredis';
import { BucketService, RateLimitModule } from 'nest-redis-rate-limit';
import { deleteKeys, redisUrl, testPrefix } from '../../support/redis.js';

/**
 * Issue 10, item 4: a local `reset()` wins over answers to requests sent before it. The denial Redis
 * gave a request that left just before the reset used to reach the deny cache after the reset had
 * cleared it, and this instance then refused a full bucket for the policy's whole window.
 */
describe('reset() against answers still on their way', () => {
  const prefix = testPrefix('reset-race');
  const day = { capacity: 1, refillPerSecond: 1 / 86_400 }; // one token a day: a learned denial lasts a day
  let moduleRef: TestingModule;
  let buckets: BucketService;
  let client: Redis;

  beforeAll(async () => {
    client = new Redis(await redisUrl());
    moduleRef = await Test.createTestingModule({
      imports: [RateLimitModule.forRoot({ redis: await redisUrl(), keyPrefix: prefix })],
    }).compile();
    await moduleRef.init();
    buckets = moduleRef.get(BucketService);
  });

  afterAll(async () => {
    await moduleRef.close();
    await deleteKeys(client, prefix);
    client.disconnect();
  });

  it.each(['reset', 'refund'] as const)(
    'a %s() started while a denial is on its way: the next request asks Redis and is allowed',
    async (what) => {
      const name = `race-${what}`;
      await buckets.reset(name);
      expect((await buckets.consume(name, day)).allowed).toBe(true); // drained for a day
      for (let round = 0; round < 5; round++) {
        // The consume leaves first (Redis denies it), the reset or refund right after it, on the same connection.
        const [denied] = await Promise.all([
          buckets.consume(name, day),
          what === 'reset' ? buckets.reset(name) : buckets.refund(name, day),
        ]);
        expect(denied.allowed).toBe(false);
        // In Redis: no key after the reset (a full bucket), one whole token after the refund.
        expect(await client.hget(`${prefix}{${name}}`, 'tokens')).toBe(what === 'reset' ? null : '1');
        // Redis holds a full bucket: this instance must ask it, not deny from what it learned before the reset.
        expect((await buckets.consume(name, day)).allowed).toBe(true);
      }
    },
  );
});
