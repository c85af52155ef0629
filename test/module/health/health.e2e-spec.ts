import { Test, type TestingModule } from '@nestjs/testing';
import { BucketService, RateLimitHealth, RateLimitModule } from 'nest-redis-rate-limit';
import { freePort, RedisServer } from '../../support/redis.js';

/**
 * Issue 33, item 6 (issue 32 item 6 pointed here): is the limiter limiting right now? `RateLimitHealth`
 * answers from what the instance knows (the client's state, the breakers, the fallback's count), as a
 * plain status and in @nestjs/terminus' shape: degraded, not down, while `failureMode` decides.
 */
const POLICY = { capacity: 5, refillPerSecond: 1 };

async function moduleWith(options: Record<string, unknown>): Promise<TestingModule> {
  const moduleRef = await Test.createTestingModule({ imports: [RateLimitModule.forRoot(options)] }).compile();
  moduleRef.useLogger(false);
  await moduleRef.init();
  return moduleRef;
}

/** Polls `read` every 20 ms until `done` holds (at most `ms`); answers the last value read. */
async function until<T>(read: () => T | Promise<T>, done: (value: T) => boolean, ms = 5_000): Promise<T> {
  const end = Date.now() + ms;
  let value = await read();
  while (!done(value) && Date.now() < end) {
    await new Promise((resolve) => setTimeout(resolve, 20));
    value = await read();
  }
  return value;
}

describe('RateLimitHealth', () => {
  const modules: TestingModule[] = [];
  let server: RedisServer | undefined;

  afterAll(async () => {
    for (const moduleRef of modules) await moduleRef.close();
    await server?.stop();
  });

  it('says up while Redis decides, degraded (not down) on the fallback with the reason, and up again when Redis is back', async () => {
    server = await RedisServer.start();
    const moduleRef = await moduleWith({ redis: server.url, keyPrefix: 'health:' });
    modules.push(moduleRef);
    const health = moduleRef.get(RateLimitHealth);
    const buckets = moduleRef.get(BucketService);
    expect(await buckets.consume('a', POLICY)).toMatchObject({ allowed: true, remaining: 4 });
    expect(health.status()).toEqual({
      status: 'up',
      store: 'redis',
      failureMode: 'local',
      reachable: true,
      failingNodes: [],
      fallbackDecisionsLastMinute: 0,
    });
    expect(await health.check()).toEqual({
      rateLimit: {
        status: 'up',
        degraded: false,
        store: 'redis',
        failureMode: 'local',
        reachable: true,
        failingNodes: [],
        fallbackDecisionsLastMinute: 0,
      },
    });

    await server.stop();
    const away = await until(
      () => health.status(),
      (s) => !s.reachable,
    );
    expect(away).toMatchObject({ status: 'degraded', reachable: false });
    expect(away.reason).toMatch(/the store is not connected; decisions follow failureMode 'local'/);
    // Decisions meanwhile follow failureMode, and are counted; the call that failed names its node.
    for (let i = 0; i < 3; i++) await buckets.consume('a', POLICY);
    const degraded = health.status();
    expect(degraded.fallbackDecisionsLastMinute).toBe(3);
    expect(degraded.failingNodes).toHaveLength(1);
    expect(degraded.reason).toMatch(/^the store failed \(.+\): .+; decisions follow failureMode 'local' \(in-process buckets/);
    expect(await health.check('limiter')).toMatchObject({ limiter: { status: 'up', degraded: true, reachable: false } });

    await server.start();
    const back = await until(
      async () => (await buckets.consume('b', POLICY), health.status()),
      (s) => s.status === 'up',
      10_000,
    );
    expect(back).toMatchObject({ status: 'up', reachable: true, failingNodes: [] });
    // The minute's count keeps the outage's decisions (and those made while it reconnected).
    expect(back.fallbackDecisionsLastMinute).toBeGreaterThanOrEqual(3);
    expect(back.reason).toBeUndefined();
  }, 30_000);

  it("says degraded from the start when Redis is unreachable, and down under failureMode 'closed' (every limited request refused)", async () => {
    const moduleRef = await moduleWith({ redis: `redis://127.0.0.1:${await freePort()}`, failureMode: 'closed', keyPrefix: 'health:' });
    modules.push(moduleRef);
    const health = moduleRef.get(RateLimitHealth);
    // Before any decision: the client is not connected.
    expect(health.status()).toMatchObject({ status: 'degraded', reachable: false, failingNodes: [], fallbackDecisionsLastMinute: 0 });
    expect(health.status().reason).toBe(
      "the store is not connected; decisions follow failureMode 'closed' (limited requests are refused with 503)",
    );
    // Rejected as terminus' indicators reject: the result in `causes`.
    await expect(health.check()).rejects.toMatchObject({
      causes: { rateLimit: { status: 'down', degraded: true, failureMode: 'closed' } },
    });
  });

  it("says up for the in-process store (store: 'memory')", async () => {
    const moduleRef = await moduleWith({ store: 'memory' });
    modules.push(moduleRef);
    await moduleRef.get(BucketService).consume('m', POLICY);
    expect(moduleRef.get(RateLimitHealth).status()).toEqual({
      status: 'up',
      store: 'memory',
      failureMode: 'local',
      reachable: true,
      failingNodes: [],
      fallbackDecisionsLastMinute: 0,
    });
  });
});
