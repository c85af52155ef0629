import { Controller, Get, type INestApplication, Module } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { Redis } from 'ioredis';
import request from 'supertest';
import { BucketService, RateLimit, RateLimitModule, type RateLimitModuleOptions } from 'nest-redis-rate-limit';
import { createApp, PLATFORMS } from '../../support/app.js';
import { deleteKeys, redisUrl, testPrefix } from '../../support/redis.js';

/** A refill so slow that no token comes back while the test runs. */
const NO_REFILL = { capacity: 100, refillPerSecond: 0.0001 };

@Controller('race')
class RaceController {
  @Get()
  @RateLimit(NO_REFILL.capacity, NO_REFILL.refillPerSecond)
  race() {
    return { ok: true };
  }
}

/**
 * About exactness, not failures: a decision that timed out under load must not pass as an admission
 * ('closed' answers 503, which these counts catch), and a generous timeout keeps load from causing one.
 */
const EXACT = { failureMode: 'closed', timeoutMs: 2000 } as const;

/**
 * Exact, and with the module's `lease: true` (issue 35: leases on for the policy keep every count the
 * same; a lease never admits what the exact bucket would not).
 */
const MODES = [
  ['exact', {}],
  ['leased', { lease: true }],
] as const satisfies readonly (readonly [string, RateLimitModuleOptions])[];

describe.each(MODES)('exact under concurrency (%s)', (mode, modeOptions) => {
  const prefix = testPrefix(`concurrency-${mode}`);
  let client: Redis;

  beforeAll(async () => {
    client = new Redis(await redisUrl());
  });

  afterAll(async () => {
    await deleteKeys(client, prefix);
    await client.quit();
  });

  it('allows exactly 100 of 300 simultaneous consume() calls on a fresh bucket of 100, each remaining count once', async () => {
    const moduleRef = await Test.createTestingModule({
      imports: [RateLimitModule.forRoot({ redis: await redisUrl(), keyPrefix: prefix, ...EXACT, ...modeOptions })],
    }).compile();
    await moduleRef.init();
    const buckets = moduleRef.get(BucketService);
    const decisions = await Promise.all(Array.from({ length: 300 }, () => buckets.consume('race', NO_REFILL)));
    const allowed = decisions.filter((d) => d.allowed);
    expect(allowed).toHaveLength(100);
    // Every token was handed out once: the remaining counts are 99, 98, ..., 0 with none repeated.
    expect(allowed.map((d) => d.remaining).sort((a, b) => a - b)).toEqual(Array.from({ length: 100 }, (_, i) => i));
    for (const denied of decisions.filter((d) => !d.allowed)) {
      expect(denied.remaining).toBe(0);
      expect(denied.retryAfterSeconds).toBeGreaterThanOrEqual(1);
    }
    await moduleRef.close();
  });

  it.each(PLATFORMS)('answers exactly 100 of 300 simultaneous HTTP requests with 200 on %s', async (platform) => {
    @Module({
      imports: [RateLimitModule.forRoot({ redis: await redisUrl(), keyPrefix: `${prefix}${platform}:`, ...EXACT, ...modeOptions })],
      controllers: [RaceController],
    })
    class RaceModule {}
    const app: INestApplication = await createApp(RaceModule, platform);
    await app.listen(0, '127.0.0.1');
    const server = app.getHttpServer();
    const statuses = await Promise.all(
      Array.from({ length: 300 }, () =>
        request(server)
          .get('/race')
          .then((res) => res.status),
      ),
    );
    expect(statuses.filter((s) => s === 200)).toHaveLength(100);
    expect(statuses.filter((s) => s === 429)).toHaveLength(200);
    await app.close();
  });
});
