import { Controller, Get, Module } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { Redis } from 'ioredis';
import { BucketService, MemoryBucketStore, RateLimit, RateLimitModule, RedisBucketStore } from 'nest-redis-rate-limit';
import { compilePolicy } from '../../../libs/rate-limit/src/policies/policy.js';
import { resolveOptions } from '../../../libs/rate-limit/src/rate-limit.options-resolver.js';
import { deleteKeys, redisUrl, testPrefix } from '../../support/redis.js';

const ROUTE = 'ExportsController.download';
const context = { apiKeyVerified: false };

describe('policy bounds: only numbers the arithmetic keeps exact are accepted', () => {
  it.each([
    [{ capacity: 1e12 + 1, refillPerSecond: 1e6 }, /capacity must be at most 1000000000000 \(got 1000000000001\)/],
    [{ capacity: 1e17, refillPerSecond: 1e6 }, /capacity must be at most 1000000000000 \(got 100000000000000000\)/],
    [{ capacity: 1e25, refillPerSecond: 1e6 }, /capacity must be at most 1000000000000 \(got 1e\+25\)/],
    [
      { capacity: 1e9, refillPerSecond: 1 / 86_400 },
      /window capacity \/ refillPerSecond must be at most 1000000000000 s \(got 86400000000000 s\)/,
    ],
    [{ capacity: 1, refillPerSecond: 1e-300 }, /window capacity \/ refillPerSecond must be at most 1000000000000 s \(got 1e\+300 s\)/],
  ])('refuses %j at start-up, naming the route', (policy, message) => {
    expect(() => compilePolicy(policy, ROUTE, context)).toThrow(message);
    expect(() => compilePolicy(policy, ROUTE, context)).toThrow(new RegExp(` on ${ROUTE}$`, 'm')); // the end of the first line: the code's lines follow
  });

  it.each([
    [{ capacity: 1e12, refillPerSecond: 1 }],
    [{ capacity: 1, refillPerSecond: 1e-12 }],
    [{ capacity: 1e12, refillPerSecond: 1e300 }],
  ])('accepts the largest values: %j', (policy) => {
    expect(compilePolicy(policy, ROUTE, context).capacity).toBe(policy.capacity);
  });

  it('stops a Nest application whose @RateLimit window does not fit PEXPIRE, naming the handler', async () => {
    @Controller('exports')
    class ExportsController {
      @Get()
      @RateLimit(1e9, 1 / 86_400)
      download() {
        return 'ok';
      }
    }
    @Module({ imports: [RateLimitModule.forRoot({ store: 'memory' })], controllers: [ExportsController] })
    class BoundsAppModule {}
    const compiling = Test.createTestingModule({ imports: [BoundsAppModule] })
      .setLogger({ log() {}, warn() {}, error() {} })
      .compile()
      .then((moduleRef) => moduleRef.init());
    await expect(compiling).rejects.toThrow(
      '@RateLimit window capacity / refillPerSecond must be at most 1000000000000 s (got 86400000000000 s) on ExportsController.download',
    );
  });

  it('applies the same bounds to BucketService calls', async () => {
    const buckets = new BucketService(new MemoryBucketStore(), resolveOptions({ store: 'memory' }));
    await expect(buckets.consume('big', { capacity: 1e13, refillPerSecond: 1 })).rejects.toThrow(
      'BucketService capacity must be at most 1000000000000 (got 10000000000000) on BucketService bucket "big"',
    );
    await expect(buckets.peek('slow', { capacity: 1e9, refillPerSecond: 1 / 86_400 })).rejects.toThrow(
      /window capacity \/ refillPerSecond must be at most 1000000000000 s .* on BucketService bucket "slow"/,
    );
    await expect(buckets.consume('largest', { capacity: 1e12, refillPerSecond: 1 }, 1e12)).resolves.toMatchObject({
      allowed: true,
      remaining: 0,
      resetSeconds: 1e12,
    });
  });
});

describe('the script checks every value before its first write', () => {
  const prefix = testPrefix('bounds');
  let client: Redis;
  let store: RedisBucketStore;

  beforeAll(async () => {
    client = new Redis(await redisUrl());
    store = new RedisBucketStore(client, false);
  });

  afterAll(async () => {
    await deleteKeys(client, prefix);
    await client.quit();
  });

  it('writes the largest accepted window with its TTL: PEXPIRE 2e15 ms, an exact integer', async () => {
    const key = `${prefix}{largest}`;
    const result = await store.take([{ key, capacity: 1e12, refillPerSecond: 1, cost: 1 }]);
    expect(result).toEqual({ allowed: true, tokens: [999_999_999_999] });
    const ttl = await client.pttl(key);
    expect(ttl).toBeGreaterThan(2e15 - 60_000);
    expect(ttl).toBeLessThanOrEqual(2e15);
  });

  it('leaves no partial write when a bucket beyond the bounds reaches it: the valid bucket is untouched too', async () => {
    const valid = `${prefix}{pair}:valid`;
    const beyond = `${prefix}{pair}:beyond`;
    const taking = store.take([
      { key: valid, capacity: 10, refillPerSecond: 1, cost: 1 },
      { key: beyond, capacity: 1e9, refillPerSecond: 1 / 86_400, cost: 1 },
    ]);
    await expect(taking).rejects.toThrow(/token-bucket: .*bucket 2/);
    expect(await client.exists(valid, beyond)).toBe(0);
  });

  it.each([
    ['a capacity above 1e12', { capacity: 1e13, refillPerSecond: 1e6, cost: 1 }],
    ['a fractional capacity', { capacity: 2.5, refillPerSecond: 1, cost: 1 }],
    ['a fractional cost', { capacity: 2, refillPerSecond: 1, cost: 1.5 }],
    ['a negative cost', { capacity: 2, refillPerSecond: 1, cost: -1 }],
    ['a refill of 0', { capacity: 2, refillPerSecond: 0, cost: 1 }],
  ])('refuses %s without writing', async (_name, numbers) => {
    const key = `${prefix}{refused}:${_name.replace(/\W/g, '-')}`;
    await expect(store.take([{ key, ...numbers }])).rejects.toThrow(/token-bucket: /);
    expect(await client.exists(key)).toBe(0);
  });
});
