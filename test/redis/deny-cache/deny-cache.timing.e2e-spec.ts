import { type INestApplication, Module } from '@nestjs/common';
import { Test, type TestingModule } from '@nestjs/testing';
import { Redis } from 'ioredis';
import { type BucketPolicy, BucketService, RateLimitModule, type RateLimitModuleOptions, RedisBucketStore } from 'nest-redis-rate-limit';
import { DenyCache } from '../../../libs/rate-limit/src/engine/deny-cache.js';
import type { BucketRequest } from '../../../libs/rate-limit/src/stores/token-bucket.js';
import { createApp, PLATFORMS } from '../../support/app.js';
import { expectCountdown } from '../../support/countdown.js';
import { type Answer, timedGet } from '../../support/load.js';
import { RedisServer, scriptCalls } from '../../support/redis.js';
import { LimitedController } from './limited.controller.js';

/** A Redis server of this file's own, so its command counters see only these requests. */
let server: RedisServer;
let client: Redis;

beforeAll(async () => {
  server = await RedisServer.start();
  client = new Redis(server.url);
});

afterAll(async () => {
  await client.quit();
  await server.stop();
});

/** A small seeded generator, so a failure can be replayed. */
function random(seed: number): () => number {
  return () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

describe('the deny cache against the Lua script', () => {
  let store: RedisBucketStore;
  let storeClient: Redis;

  beforeAll(async () => {
    storeClient = new Redis(server.url, { enableOfflineQueue: false, lazyConnect: true });
    await storeClient.connect();
    store = new RedisBucketStore(storeClient, false);
  });

  afterAll(() => storeClient.quit());

  it.each([1, 2, 3])(
    'never denies what Redis would allow, for any cost, with other instances draining the same buckets (seed %i)',
    async (seed) => {
      const next = random(seed);
      let now = 1_750_000_000_000;
      const cache = new DenyCache(10_000, () => now);
      const policies: BucketPolicy[] = [
        { capacity: 5, refillPerSecond: 1 },
        { capacity: 20, refillPerSecond: 7.5 },
        { capacity: 3, refillPerSecond: 0.3 },
        { capacity: 100, refillPerSecond: 250 },
      ];
      const bucket = (i: number, cost: number): BucketRequest => ({
        key: `deny-cache:${seed}:{b${i}}`,
        ...policies[i],
        cost: Math.min(cost, policies[i].capacity),
      });
      let localDenials = 0;
      let asked = 0;
      const violations: string[] = [];
      for (let step = 0; step < 1500; step++) {
        now += Math.floor(next() * next() * 400);
        const costOf = (i: number) => (next() < 0.7 ? 1 : 1 + Math.floor(next() * policies[i].capacity));
        const first = Math.floor(next() * policies.length);
        const requests = [bucket(first, costOf(first))];
        if (next() < 0.2) requests.push(bucket((first + 1) % policies.length, costOf((first + 1) % policies.length)));
        if (next() < 0.3) {
          // another instance drains the buckets; this one's cache does not see it
          await store.take(requests, { now });
          continue;
        }
        const local = cache.deny(requests, now);
        if (local !== undefined) {
          localDenials++;
          const truth = await store.take(requests, { now, dryRun: true });
          if (truth.allowed) violations.push(`step ${step}: denied locally, Redis would allow ${JSON.stringify(requests)}`);
          truth.tokens.forEach((tokens, i) => {
            if (local[i] < tokens - 1e-9) violations.push(`step ${step}: bound ${local[i]} below Redis' ${tokens}`);
          });
          continue;
        }
        asked++;
        const sentAt = now;
        now += Math.floor(next() * 5); // Redis decides a moment after the request was sent
        cache.learn(requests, await store.take(requests, { now }), sentAt);
      }
      expect(violations).toEqual([]);
      // not vacuous: a good share of this instance's decisions never reached Redis
      expect(localDenials).toBeGreaterThan(asked / 4);
      await client.del(...policies.map((_, i) => bucket(i, 1).key));
    },
  );
});

describe('BucketService with the deny cache', () => {
  const policy: BucketPolicy = { capacity: 3, refillPerSecond: 0.5 };
  let moduleRef: TestingModule;

  async function start(options: RateLimitModuleOptions = {}): Promise<BucketService> {
    moduleRef = await Test.createTestingModule({
      imports: [RateLimitModule.forRoot({ redis: server.url, keyPrefix: 'svc:', ...options })],
    }).compile();
    await moduleRef.init();
    return moduleRef.get(BucketService);
  }

  afterEach(async () => {
    await moduleRef.close();
    const keys = await client.keys('svc:*');
    if (keys.length) await client.del(...keys);
  });

  it('answers 196 of 200 consume() calls on an empty bucket without Redis, with the numbers Redis gives', async () => {
    const buckets = await start();
    const before = await scriptCalls(client);
    const decisions = [];
    for (let i = 0; i < 200; i++) decisions.push(await buckets.consume('hammered', policy));
    expect(decisions.filter((d) => d.allowed)).toHaveLength(3);
    expect(await scriptCalls(client)).toBeLessThanOrEqual(before + 5);
    for (const d of decisions.slice(3)) {
      expect(d).toEqual({ allowed: false, limit: 3, remaining: 0, retryAfterSeconds: 2, resetSeconds: 6 });
    }
  });

  it('asks Redis for every call with denyCache: false', async () => {
    const buckets = await start({ denyCache: false });
    const before = await scriptCalls(client);
    for (let i = 0; i < 50; i++) await buckets.consume('hammered', policy);
    expect(await scriptCalls(client)).toBe(before + 50);
  });

  it('stops denying locally at once after reset() on this instance', async () => {
    const buckets = await start();
    for (let i = 0; i < 4; i++) await buckets.consume('reset-me', policy);
    expect((await buckets.consume('reset-me', policy)).allowed).toBe(false);
    await buckets.reset('reset-me');
    expect(await buckets.consume('reset-me', policy)).toMatchObject({ allowed: true, remaining: 2 });
  });

  it('lets two instances on one bucket admit no more than B + R·t, and still take the tokens as they come', async () => {
    const a = await start();
    const first = moduleRef;
    const b = await start();
    const bucketPolicy: BucketPolicy = { capacity: 10, refillPerSecond: 20 };
    const before = await scriptCalls(client);
    const started = performance.now();
    const until = started + 1500;
    let allowed = 0;
    let calls = 0;
    const lane = async (buckets: BucketService) => {
      while (performance.now() < until) {
        calls++;
        if ((await buckets.consume('shared', bucketPolicy)).allowed) allowed++;
      }
    };
    await Promise.all([...Array.from({ length: 16 }, () => lane(a)), ...Array.from({ length: 16 }, () => lane(b))]);
    const seconds = (performance.now() - started) / 1000;
    await first.close();
    expect(allowed).toBeLessThanOrEqual(Math.floor(10 + 20 * seconds));
    expect(allowed).toBeGreaterThanOrEqual(Math.floor(10 + 20 * seconds * 0.5));
    expect(await scriptCalls(client)).toBeLessThan(before + calls / 3);
  });
});

describe.each(PLATFORMS)('the guard with the deny cache, on %s', (platform) => {
  let app: INestApplication;

  afterEach(async () => {
    await app.close();
    const keys = await client.keys('http:*');
    if (keys.length) await client.del(...keys);
  });

  it('answers a burst of 30 with 3 × 200 and 27 × 429 carrying Retry-After, from at most 5 Redis calls', async () => {
    @Module({
      imports: [RateLimitModule.forRoot({ redis: server.url, keyPrefix: 'http:' })],
      controllers: [LimitedController],
    })
    class DenyCacheModule {}
    app = await createApp(DenyCacheModule, platform);
    // One listening server and fetch's kept-alive connection: a request per connection (supertest on the
    // bare server) made the burst take over a second on a loaded machine.
    await app.listen(0, '127.0.0.1');
    const url = `${(await app.getUrl()).replace('[::1]', '127.0.0.1')}/limited`;
    const before = await scriptCalls(client);
    const since = performance.now();
    const answers: Answer[] = [];
    for (let i = 0; i < 30; i++) answers.push(await timedGet(url));
    const burstSeconds = (performance.now() - since) / 1000;
    // 3 tokens, refilled every 2 s from the first request: a burst that took T s may see floor(0.5·T) more
    // allowed, each at most 3 more Redis calls (the allowed one, the denial that caches again, one the cache
    // let through at its edge); none in the usual run, which takes well under 2 s.
    const refilled = Math.floor(0.5 * burstSeconds);
    const statuses = answers.map((a) => a.status);
    expect(statuses.slice(0, 3)).toEqual([200, 200, 200]);
    expect(statuses.filter((s) => s !== 200 && s !== 429)).toEqual([]);
    const allowed = statuses.filter((s) => s === 200).length;
    expect({ allowed, burstSeconds }).toEqual({ allowed: Math.min(allowed, 3 + refilled), burstSeconds });
    for (const res of answers.filter((a) => a.status === 429)) {
      // Counts down from the first request: exactly 2 within a second.
      expectCountdown(res.retryAfter, 2, since, res.endedAt);
      expect(res.remaining).toBe('0');
      expect(JSON.parse(res.body ?? '')).toEqual({ statusCode: 429, message: 'Too Many Requests', retryAfter: Number(res.retryAfter) });
    }
    expect(answers.filter((a) => a.status === 429).map((a) => a.limit)).toEqual(answers.filter((a) => a.status === 429).map(() => '3'));
    expect(await scriptCalls(client)).toBeLessThanOrEqual(before + 5 + 3 * refilled);
  });
});
