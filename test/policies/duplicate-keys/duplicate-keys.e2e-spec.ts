import { Controller, Get, type INestApplication, Module } from '@nestjs/common';
import { Redis } from 'ioredis';
import request from 'supertest';
import { BucketService, MemoryBucketStore, RateLimit, RateLimitModule, RedisBucketStore } from 'nest-redis-rate-limit';
import { resolveOptions } from '../../../libs/rate-limit/src/rate-limit.options-resolver.js';
import { createApp } from '../../support/app.js';
import { deleteKeys, keysUnder, redisUrl, testPrefix } from '../../support/redis.js';

/** A slow refill: nothing comes back during a test. */
const TWO = { capacity: 2, refillPerSecond: 0.001 };

describe('one bucket named twice in one BucketService.consumeAll call', () => {
  const prefix = testPrefix('duplicate-keys');
  let client: Redis;
  let buckets: BucketService;

  beforeAll(async () => {
    client = new Redis(await redisUrl());
    buckets = new BucketService(new RedisBucketStore(client, false), resolveOptions({ keyPrefix: prefix }));
  });

  afterAll(async () => {
    await deleteKeys(client, prefix);
    await client.quit();
  });

  it('is drained by the sum of the costs: twice 1 from a capacity-2 bucket leaves 0, and the next call is refused', async () => {
    const first = await buckets.consumeAll([
      { name: 'twice', policy: TWO },
      { name: 'twice', policy: TWO },
    ]);
    expect(first.allowed).toBe(true);
    expect(first.decisions).toEqual([
      { allowed: true, limit: 2, remaining: 0, retryAfterSeconds: 0, resetSeconds: 2000 },
      { allowed: true, limit: 2, remaining: 0, retryAfterSeconds: 0, resetSeconds: 2000 },
    ]);
    expect(Number(await client.hget(`${prefix}{twice}`, 'tokens'))).toBe(0);
    const second = await buckets.consumeAll([
      { name: 'twice', policy: TWO },
      { name: 'twice', policy: TWO },
    ]);
    expect(second.allowed).toBe(false);
    expect(second.decisions.map((d) => d.retryAfterSeconds)).toEqual([2000, 2000]);
  });

  it('refuses the whole call when the summed cost is more than there is, taking nothing from the other buckets', async () => {
    await buckets.consume('half', TWO, 1);
    const result = await buckets.consumeAll([
      { name: 'half', policy: TWO },
      { name: 'other', policy: TWO },
      { name: 'half', policy: TWO },
    ]);
    expect(result.allowed).toBe(false);
    expect(result.decisions.map((d) => d.remaining)).toEqual([1, 2, 1]);
    expect(await client.exists(`${prefix}{other}`)).toBe(0);
    expect(Number(await client.hget(`${prefix}{half}`, 'tokens'))).toBeCloseTo(1, 2);
  });

  it('throws when the costs of one bucket add up to more than its capacity (it could never pass)', async () => {
    await expect(
      buckets.consumeAll([
        { name: 'over', policy: TWO, cost: 2 },
        { name: 'over', policy: TWO, cost: 1 },
      ]),
    ).rejects.toThrow('BucketService costs of bucket "over" add up to 3, more than its capacity 2');
    expect(await client.exists(`${prefix}{over}`)).toBe(0);
  });

  it('gives back the summed cost when a decision with a repeated key is refunded (a route refused in its second phase)', async () => {
    const key = `${prefix}{refunded}`;
    const requests = [
      { key, ...TWO, cost: 1 },
      { key, ...TWO, cost: 1 },
    ];
    const taken = await buckets.decide(requests);
    expect(taken.allowed).toBe(true);
    const tokens = await buckets.giveBack(requests, taken.source);
    expect(tokens).toHaveLength(2);
    expect(tokens![0]).toBeCloseTo(2, 2);
    expect(tokens![1]).toBe(tokens![0]);
    expect(Number(await client.hget(key, 'tokens'))).toBeCloseTo(2, 2);
  });

  it.each(['redis', 'memory'])('is refused by the %s store itself when it reaches it unmerged, with nothing written', async (which) => {
    const key = `${prefix}{unmerged:${which}}`;
    const store = which === 'redis' ? new RedisBucketStore(client, false) : new MemoryBucketStore();
    const taking = store.take([
      { key, ...TWO, cost: 1 },
      { key, ...TWO, cost: 1 },
    ]);
    await expect(taking).rejects.toThrow(/the same key twice in one decision/);
    expect(await client.exists(key)).toBe(0);
  });

  it('throws when one bucket is given two different policies', async () => {
    await expect(
      buckets.consumeAll([
        { name: 'mixed', policy: TWO },
        { name: 'mixed', policy: { capacity: 3, refillPerSecond: 0.001 } },
      ]),
    ).rejects.toThrow('BucketService bucket "mixed" appears twice with different policies');
  });
});

@Controller('shared')
class SharedController {
  /** Both policies resolve to one key for a client without an API key: the API key falls back to the IP. */
  @Get()
  @RateLimit({ capacity: 2, refillPerSecond: 0.001, name: 'shared', keyBy: 'apiKey' })
  @RateLimit({ capacity: 2, refillPerSecond: 0.001, name: 'shared', keyBy: 'ip' })
  get() {
    return 'ok';
  }
}

describe('stacked named policies that meet on one key at run time', () => {
  const prefix = testPrefix('duplicate-route');
  let client: Redis;
  let app: INestApplication;

  beforeAll(async () => {
    client = new Redis(await redisUrl());
    @Module({
      imports: [RateLimitModule.forRoot({ redis: await redisUrl(), keyPrefix: prefix })],
      controllers: [SharedController],
    })
    class DuplicateAppModule {}
    app = await createApp(DuplicateAppModule, 'express');
  });

  afterAll(async () => {
    await app?.close();
    await deleteKeys(client, prefix);
    await client.quit();
  });

  it('drain the bucket once per policy: an anonymous client gets one request from a capacity-2 bucket', async () => {
    const first = await request(app.getHttpServer()).get('/shared').expect(200);
    expect(first.headers['x-ratelimit-remaining']).toBe('0');
    expect(Number(await client.hget(`${prefix}{ip:127.0.0.1}:shared`, 'tokens'))).toBe(0);
    const second = await request(app.getHttpServer()).get('/shared').expect(429);
    expect(Number(second.headers['retry-after'])).toBeGreaterThanOrEqual(1000);
  });

  it('leave a client with an API key its own bucket and the IP bucket, one token each', async () => {
    await deleteKeys(client, prefix);
    await request(app.getHttpServer()).get('/shared').set('x-api-key', 'k-1').expect(200);
    expect(Number(await client.hget(`${prefix}{ip:127.0.0.1}:shared`, 'tokens'))).toBe(1);
    const keys = (await keysUnder(client, `${prefix}{key:`)).filter((key) => key.endsWith(':shared'));
    expect(keys).toHaveLength(1);
    expect(Number(await client.hget(keys[0], 'tokens'))).toBe(1);
  });
});
