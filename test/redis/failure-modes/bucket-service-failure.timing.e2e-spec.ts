import { performance } from 'node:perf_hooks';
import { Controller, Get, type INestApplication, Module, ServiceUnavailableException } from '@nestjs/common';
import { Test, type TestingModule } from '@nestjs/testing';
import { Redis } from 'ioredis';
import request from 'supertest';
import { BucketService, RateLimitModule, RateLimitUnavailableError } from 'nest-redis-rate-limit';
import { createApp, PLATFORMS } from '../../support/app.js';
import { watchLoopDelay } from '../../support/loop-delay.js';
import { RedisServer } from '../../support/redis.js';
import { expectWaitsBounded } from './timing.js';

/**
 * README, "BucketService" and "When Redis fails": what `consume`, `consumeAll`, `peek` and `reset`
 * answer while Redis is down ('closed': `RateLimitUnavailableError`, a 503; 'open': allowed as if the
 * bucket were full), and `timeoutMs` bounding a decision made through a client the application passed
 * in. Every test has a redis-server of its own, which it kills or pauses.
 */
const POLICY = { capacity: 5, refillPerSecond: 0.5 };
const UNAVAILABLE_BODY = {
  statusCode: 503,
  message: 'Rate limiting is unavailable; try again shortly',
  error: 'Service Unavailable',
};

async function serviceOn(redis: string | Redis, failureMode: 'open' | 'closed', timeoutMs = 100) {
  const moduleRef = await Test.createTestingModule({
    imports: [RateLimitModule.forRoot({ redis, failureMode, timeoutMs })],
  }).compile();
  moduleRef.useLogger(false);
  await moduleRef.init();
  return { moduleRef, buckets: moduleRef.get(BucketService) };
}

describe("BucketService with failureMode 'closed' while its Redis is down", () => {
  let server: RedisServer;
  let moduleRef: TestingModule;
  let buckets: BucketService;

  beforeAll(async () => {
    server = await RedisServer.start();
    ({ moduleRef, buckets } = await serviceOn(server.url, 'closed'));
    // Redis decides while it lives.
    expect(await buckets.consume('before', POLICY, 2)).toEqual({
      allowed: true,
      limit: 5,
      remaining: 3,
      retryAfterSeconds: 0,
      resetSeconds: 4,
    });
    await server.stop('SIGKILL');
  });

  afterAll(async () => {
    try {
      await moduleRef?.close();
    } finally {
      // Even if closing failed.
      await server?.stop();
    }
  });

  async function rejection(call: () => Promise<unknown>): Promise<unknown> {
    return call().then(
      (value) => ({ resolved: value }),
      (error: unknown) => error,
    );
  }

  it.each([
    ['consume', () => buckets.consume('export', POLICY)],
    [
      'consumeAll',
      () =>
        buckets.consumeAll([
          { name: 'a', policy: POLICY },
          { name: 'b', policy: POLICY, cost: 2 },
        ]),
    ],
    ['peek', () => buckets.peek('export', POLICY)],
  ])('%s() rejects with RateLimitUnavailableError, a 503 ServiceUnavailableException with the guard’s body', async (_name, call) => {
    const error = await rejection(call);
    expect(error).toBeInstanceOf(RateLimitUnavailableError);
    expect(error).toBeInstanceOf(ServiceUnavailableException);
    const unavailable = error as RateLimitUnavailableError;
    expect(unavailable.getStatus()).toBe(503);
    expect(unavailable.getResponse()).toEqual(UNAVAILABLE_BODY);
  });

  it('reset() rejects rather than answering as if the bucket had been made full', async () => {
    // The README promises nothing more for reset(); today the rejection is the ioredis error itself.
    await expect(buckets.reset('before')).rejects.toBeInstanceOf(Error);
  });
});

describe("BucketService with failureMode 'open' while its Redis is down", () => {
  let server: RedisServer;
  let moduleRef: TestingModule;
  let buckets: BucketService;

  beforeAll(async () => {
    server = await RedisServer.start();
    ({ moduleRef, buckets } = await serviceOn(server.url, 'open'));
    // A bucket Redis has emptied (allowed to its last token, so no denial for the deny cache to repeat).
    expect((await buckets.consume('drained', POLICY, 5)).remaining).toBe(0);
    await server.stop('SIGKILL');
  });

  afterAll(async () => {
    try {
      await moduleRef?.close();
    } finally {
      // Even if closing failed.
      await server?.stop();
    }
  });

  it('consume() allows as if the bucket were full, even one Redis had emptied', async () => {
    // Full (5) minus the cost (2); full again 2 / 0.5 = 4 s later.
    const full = { allowed: true, limit: 5, remaining: 3, retryAfterSeconds: 0, resetSeconds: 4 };
    expect(await buckets.consume('drained', POLICY, 2)).toEqual(full);
    expect(await buckets.consume('fresh', POLICY, 2)).toEqual(full);
  });

  it('consumeAll() allows every entry as if its bucket were full', async () => {
    expect(
      await buckets.consumeAll([
        { name: 'drained', policy: POLICY },
        { name: 'b', policy: POLICY, cost: 3 },
      ]),
    ).toEqual({
      allowed: true,
      decisions: [
        { allowed: true, limit: 5, remaining: 4, retryAfterSeconds: 0, resetSeconds: 2 },
        { allowed: true, limit: 5, remaining: 2, retryAfterSeconds: 0, resetSeconds: 6 },
      ],
    });
  });

  it('peek() answers what a full bucket would', async () => {
    expect(await buckets.peek('drained', POLICY)).toEqual({ allowed: true, limit: 5, remaining: 4, retryAfterSeconds: 0, resetSeconds: 2 });
  });

  it('reset() rejects rather than answering as if the bucket had been made full', async () => {
    await expect(buckets.reset('drained')).rejects.toBeInstanceOf(Error);
  });
});

describe.each(PLATFORMS)("a controller calling BucketService with failureMode 'closed' while Redis is down, on %s", (platform) => {
  let server: RedisServer;
  let app: INestApplication;

  beforeAll(async () => {
    server = await RedisServer.start();
    @Controller('exports')
    class ExportsController {
      constructor(private readonly buckets: BucketService) {}

      @Get()
      start() {
        return this.buckets.consume('exports', POLICY);
      }
    }
    @Module({ imports: [RateLimitModule.forRoot({ redis: server.url, failureMode: 'closed' })], controllers: [ExportsController] })
    class ExportsModule {}
    app = await createApp(ExportsModule, platform);
  });

  afterAll(async () => {
    try {
      await app?.close();
    } finally {
      // Even if closing failed.
      await server?.stop();
    }
  });

  it('answers 503 with the guard’s body when consume() rejects uncaught', async () => {
    expect((await request(app.getHttpServer()).get('/exports').expect(200)).body).toMatchObject({ allowed: true, remaining: 4 });
    await server.stop('SIGKILL');
    const refused = await request(app.getHttpServer()).get('/exports').expect(503);
    expect(refused.body).toEqual(UNAVAILABLE_BODY);
  });
});

describe('timeoutMs with a Redis client the application passed in', () => {
  const TIMEOUT_MS = 150;
  let server: RedisServer;
  let client: Redis;
  let moduleRef: TestingModule;
  let buckets: BucketService;

  beforeAll(async () => {
    server = await RedisServer.start();
    // ioredis' defaults: an offline queue, no command timeout. Only the module's timeout can bound a decision.
    client = new Redis(server.url);
    client.on('error', () => undefined);
    await client.ping();
    ({ moduleRef, buckets } = await serviceOn(client, 'closed', TIMEOUT_MS));
  });

  afterAll(async () => {
    try {
      server?.signal('SIGCONT');
      await moduleRef?.close();
      client?.disconnect();
    } finally {
      // Even if closing failed.
      await server?.stop();
    }
  });

  it('gives up on a Redis that stopped answering after timeoutMs, and decides through it again once it answers', async () => {
    // Refills one token per 100 s: what the test takes stays taken while it runs.
    const slow = { capacity: 5, refillPerSecond: 0.01 };
    expect((await buckets.consume('frozen', slow)).remaining).toBe(4);
    server.signal('SIGSTOP');
    // Thawed after 1.5 s whatever happens, so that a decision the timeout does not bound fails the bound instead of the jest timeout.
    const thaw = setTimeout(() => server.signal('SIGCONT'), 1_500);
    const loop = watchLoopDelay();
    try {
      // Three at once: none has failed yet, so each asks the frozen Redis and waits out its own deadline.
      const waits = await Promise.all(
        Array.from({ length: 3 }, async (_, i) => {
          const startedAt = performance.now();
          const error = await buckets.consume(`frozen-${i}`, slow).then(
            () => undefined,
            (e: unknown) => e,
          );
          return { error, startedAt, endedAt: performance.now() };
        }),
      );
      for (const { error, startedAt, endedAt } of waits) {
        expect(error).toBeInstanceOf(RateLimitUnavailableError);
        expect(endedAt - startedAt).toBeGreaterThanOrEqual(TIMEOUT_MS - 1);
      }
      // Each at most timeoutMs + SLACK_MS + the event-loop delay meanwhile (timing.ts).
      expectWaitsBounded(waits, TIMEOUT_MS, loop);
    } finally {
      loop.stop();
      clearTimeout(thaw);
      server.signal('SIGCONT');
    }
    // Thawed, the same client decides again (the commands the frozen server received ran on thaw, in other buckets).
    let remaining: number | undefined;
    for (const deadline = Date.now() + 3_000; remaining === undefined && Date.now() < deadline;) {
      remaining = await buckets.consume('frozen', slow).then(
        (d) => d.remaining,
        () => undefined,
      );
    }
    expect(remaining).toBe(3);
  });
});
