import { type INestApplication, Module } from '@nestjs/common';
import { INTERCEPTORS_METADATA } from '@nestjs/common/constants.js';
import { Redis } from 'ioredis';
import request from 'supertest';
import { RateLimitInterceptor, RateLimitModule, type RateLimitModuleOptions } from 'nest-redis-rate-limit';
import { createApp, PLATFORMS, type Platform } from '../../support/app.js';
import { deleteKeys, redisUrl, testPrefix, tokensOf } from '../../support/redis.js';
import { LimitedController, UnlimitedController } from './interceptor.controllers.js';

/** Counts RateLimitInterceptor.intercept calls while a test runs. */
function countIntercepts() {
  const original = RateLimitInterceptor.prototype.intercept;
  const counter = { calls: 0, restore: () => (RateLimitInterceptor.prototype.intercept = original) };
  RateLimitInterceptor.prototype.intercept = function (this: RateLimitInterceptor, ...args) {
    counter.calls++;
    return original.apply(this, args);
  };
  return counter;
}

describe.each(PLATFORMS)('RateLimitInterceptor on %s', (platform: Platform) => {
  const prefix = testPrefix(`interceptor-${platform}`);
  let client: Redis;
  let app: INestApplication | undefined;
  let counter: ReturnType<typeof countIntercepts>;

  async function start(name: string, options: RateLimitModuleOptions = {}) {
    @Module({
      imports: [
        RateLimitModule.forRoot({
          redis: await redisUrl(),
          keyPrefix: `${prefix}${name}:`,
          keys: { user: (req) => req.headers['x-user'] },
          ...options,
        }),
      ],
      controllers: [UnlimitedController, LimitedController],
    })
    class InterceptorAppModule {}
    app = await createApp(InterceptorAppModule, platform);
  }
  const get = (path: string, tenant = 'acme') => request(app!.getHttpServer()).get(path).set('x-tenant', tenant);

  beforeAll(async () => {
    client = new Redis(await redisUrl());
  });
  beforeEach(() => {
    counter = countIntercepts();
  });
  afterEach(async () => {
    counter.restore();
    await app?.close();
    app = undefined;
  });
  afterAll(async () => {
    await deleteKeys(client, prefix);
    await client.quit();
  });

  it('is attached once where a policy may be decided after the guards, and never for per-IP policies', () => {
    expect(Reflect.getMetadata(INTERCEPTORS_METADATA, LimitedController.prototype.stacked)).toEqual([RateLimitInterceptor]);
    expect(Reflect.getMetadata(INTERCEPTORS_METADATA, LimitedController.prototype.byUser)).toEqual([RateLimitInterceptor]);
    expect(Reflect.getMetadata(INTERCEPTORS_METADATA, LimitedController)).toBeUndefined();
    expect(Reflect.getMetadata(INTERCEPTORS_METADATA, LimitedController.prototype.byClass)).toBeUndefined();
    expect(Reflect.getMetadata(INTERCEPTORS_METADATA, UnlimitedController)).toBeUndefined();
  });

  it('never runs on routes without a policy, and is not registered globally without defaults', async () => {
    await start('unlimited');
    for (let i = 0; i < 5; i++) {
      const response = await get('/open').expect(200);
      expect(response.headers['x-ratelimit-limit']).toBeUndefined();
    }
    expect(counter.calls).toBe(0);
  });

  it('decides a route decorated on its class and twice on its handler once per request, and leaves the whole verdict', async () => {
    await start('stacked');
    const first = await get('/limited/stacked').expect(200);
    // The handler's policies replace the class policy; the tenant policy (after guards) has the fewest left.
    // RATE_LIMIT_VERDICT holds both phases' policies and the verdict over them, decided in Redis.
    expect(first.body).toEqual({
      scopes: ['stacked-ip', 'stacked-tenant'],
      phases: ['before-guards', 'after-guards'],
      allowed: true,
      source: 'store',
      remaining: [3, 2],
    });
    expect(first.headers['x-ratelimit-limit']).toBe('3');
    expect(first.headers['x-ratelimit-remaining']).toBe('2');
    expect((await get('/limited/stacked').expect(200)).body.remaining).toEqual([2, 1]);
    expect(counter.calls).toBe(2);
    await get('/limited/stacked').expect(200);
    const refused = await get('/limited/stacked').expect(429);
    expect(refused.headers['x-ratelimit-limit']).toBe('3');
    // The tenant bucket is empty and refills 0.001 token/s: its next token is 1000 s away.
    expect(refused.headers['retry-after']).toBe('1000');
    // The tenant refusal gave the IP token back: 4 - 3 = 1 left, so another tenant gets in once more.
    expect(await tokensOf(client, `${prefix}stacked:{ip:127.0.0.1}:stacked-ip`)).toBeGreaterThanOrEqual(1);
    expect((await get('/limited/stacked', 'globex').expect(200)).body.remaining).toEqual([0, 2]);
  });

  it('leaves per-IP routes to the guard, headers and RATE_LIMIT_VERDICT included, and writes none on a skipped handler', async () => {
    await start('class');
    const decided = await get('/limited/class').expect(200);
    expect(decided.headers['x-ratelimit-remaining']).toBe('4');
    // The class policy is scoped by the handler; its bucket of 5 refills 0.001/s, so it is full again 1000 s later.
    expect(decided.body).toEqual({
      scopes: ['LimitedController.byClass'],
      verdict: {
        allowed: true,
        source: 'store',
        decisions: [{ allowed: true, limit: 5, remaining: 4, retryAfterSeconds: 0, resetSeconds: 1000 }],
      },
    });
    expect((await get('/limited/skipped').expect(200)).headers['x-ratelimit-limit']).toBeUndefined();
    expect(counter.calls).toBe(0);
  });

  it('runs once per request on a handler with two user policies, and writes the headers', async () => {
    await start('user');
    const first = await get('/limited/by-user').set('x-user', 'ann').expect(200);
    expect(first.headers['x-ratelimit-limit']).toBe('2');
    expect(first.headers['x-ratelimit-remaining']).toBe('1');
    await get('/limited/by-user').set('x-user', 'ann').expect(200);
    await get('/limited/by-user').set('x-user', 'ann').expect(429);
    expect(counter.calls).toBe(3);
  });

  it('is not registered globally for per-IP module defaults: the guard limits and writes the headers', async () => {
    await start('ip-defaults', { defaults: { capacity: 2, refillPerSecond: 0.001 } });
    expect((await get('/open').expect(200)).headers['x-ratelimit-remaining']).toBe('1');
    await get('/open').expect(200);
    await get('/open').expect(429);
    expect(counter.calls).toBe(0);
  });

  it('is registered globally when module defaults have a policy decided after the guards', async () => {
    await start('defaults', { defaults: { capacity: 2, refillPerSecond: 0.001, keyBy: 'user' } });
    const first = await get('/open').expect(200);
    expect(first.headers['x-ratelimit-limit']).toBe('2');
    expect(first.headers['x-ratelimit-remaining']).toBe('1');
    await get('/open').expect(200);
    await get('/open').expect(429);
    expect(counter.calls).toBe(3);
  });
});
