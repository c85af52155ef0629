import { type INestApplication, Logger } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import request from 'supertest';
import { RateLimit, RateLimitModule, type RateLimitModuleOptions } from 'nest-redis-rate-limit';
import { Controller, Get, Module } from '@nestjs/common';
import { createApp, PLATFORMS } from '../../support/app.js';
import { LogRecorder } from '../../support/log-recorder.js';
import { redisUrl, tokensOf } from '../../support/redis.js';
import { redisScenario } from '../../support/scenario.js';
import { expectCountdown } from '../../support/countdown.js';
import { PlanLimits, PlanStore, perRequestAppModule } from './per-request.controllers.js';

/** Per-request numbers: functions of the request and resolver classes (issue 12, item 1). */
describe.each(PLATFORMS)('per-request limits on %s', (platform) => {
  const scenario = redisScenario(`per-request-${platform}`, { restoreLogger: true });
  const logs = new LogRecorder();

  async function start(options: RateLimitModuleOptions = {}): Promise<{ app: INestApplication; url: string; keyPrefix: string }> {
    const keyPrefix = scenario.nextKeyPrefix();
    const app = await createApp(perRequestAppModule({ redis: await redisUrl(), keyPrefix, ...options }), platform);
    scenario.track(app);
    // After the app is made: createApp turns Nest's own logger off.
    Logger.overrideLogger(logs);
    await app.listen(0, '127.0.0.1');
    return { app, url: await app.getUrl(), keyPrefix };
  }

  const statuses = (responses: { status: number }[]) => {
    const count = new Map<number, number>();
    for (const r of responses) count.set(r.status, (count.get(r.status) ?? 0) + 1);
    return Object.fromEntries(count);
  };

  it('gives each user the capacity of its plan: 20 parallel requests allow exactly 5 (pro) and 2 (free)', async () => {
    const { url, keyPrefix } = await start();
    const pro = await Promise.all(
      Array.from({ length: 20 }, () => request(url).get('/dyn/plan').set('x-user', 'ann').set('x-plan', 'pro')),
    );
    const free = await Promise.all(Array.from({ length: 20 }, () => request(url).get('/dyn/plan').set('x-user', 'bob')));
    expect(statuses(pro)).toEqual({ 200: 5, 429: 15 });
    expect(statuses(free)).toEqual({ 200: 2, 429: 18 });
    const allowed = pro.find((r) => r.status === 200)!;
    expect(allowed.headers['ratelimit-limit']).toBe('5');
    expect(allowed.headers['ratelimit-policy']).toBe('5;w=5000');
    expect(free.find((r) => r.status === 429)!.headers['ratelimit-limit']).toBe('2');
    expect(await tokensOf(scenario.client, `${keyPrefix}{user:ann}:PerRequestController.plan`)).toBeLessThan(0.1);
    expect(await tokensOf(scenario.client, `${keyPrefix}{user:bob}:PerRequestController.plan`)).toBeLessThan(0.1);
  });

  it('takes a cost computed from the request (async), exactly', async () => {
    const { url, keyPrefix } = await start();
    const key = `${keyPrefix}{ip:127.0.0.1}:PerRequestController.cost`;
    expect((await request(url).get('/dyn/cost?n=3').expect(200)).headers['ratelimit-remaining']).toBe('7');
    expect((await request(url).get('/dyn/cost?n=4').expect(200)).headers['ratelimit-remaining']).toBe('3');
    const denied = await request(url).get('/dyn/cost?n=4').expect(429);
    expect(denied.headers['retry-after']).toBe('1000');
    expect((await request(url).get('/dyn/cost?n=3').expect(200)).headers['ratelimit-remaining']).toBe('0');
    const tokens = await tokensOf(scenario.client, key);
    expect(tokens).toBeGreaterThanOrEqual(0);
    expect(tokens).toBeLessThan(0.05);
  });

  it('refuses with 500, logged once, when a computed number is invalid and the policy has no fallback; nothing is written', async () => {
    const { url, keyPrefix } = await start();
    logs.clear();
    for (const capacity of ['0', '2.5', 'abc', '1e13']) {
      const response = await request(url).get(`/dyn/query?capacity=${capacity}`).expect(500);
      expect(response.body.message).toBe('The rate limit of this route could not be computed');
    }
    const warned = logs.of('RateLimit', 'warn').filter((m) => m.includes('PerRequestController.query'));
    expect(warned).toHaveLength(1);
    expect(warned[0]).toContain('capacity must be an integer >= 1 (got 0)');
    expect(warned[0]).toContain('refused with 500');
    expect(await scenario.client.exists(`${keyPrefix}{ip:127.0.0.1}:PerRequestController.query`)).toBe(0);
    // A valid one on the same route is limited as usual.
    await request(url).get('/dyn/query?capacity=1').expect(200);
    await request(url).get('/dyn/query?capacity=1').expect(429);
  });

  it('asks an injected resolver once per identity within resolverCacheMs, with the identity it limits', async () => {
    const { app, url } = await start({ resolverCacheMs: 60_000 });
    const store = app.get(PlanStore);
    const resolver = app.get(PlanLimits);
    store.plans.set('cat', { capacity: 3, refillPerSecond: 0.001 });
    const responses = await Promise.all(Array.from({ length: 12 }, () => request(url).get('/dyn/resolved').set('x-user', 'cat')));
    expect(statuses(responses)).toEqual({ 200: 3, 429: 9 });
    expect(store.lookups).toBe(1);
    expect(resolver.seen).toEqual([{ kind: 'user', value: 'cat' }]);
    await request(url).get('/dyn/resolved').set('x-user', 'dan').expect(200);
    expect(store.lookups).toBe(2);
    // Without a user, the policy falls back to the IP, and the resolver is told so.
    await request(url).get('/dyn/resolved').expect(200);
    expect(resolver.seen[2]).toEqual({ kind: 'ip', value: '127.0.0.1' });
  });

  it('keeps the tokens across a plan change, capped at the new capacity, and the deny cache follows the new plan', async () => {
    const { app, url, keyPrefix } = await start({ resolverCacheMs: 0 });
    const store = app.get(PlanStore);
    const key = `${keyPrefix}{user:eve}:PerRequestController.resolved`;
    store.plans.set('eve', { capacity: 5, refillPerSecond: 0.001 });
    await request(url).get('/dyn/resolved').set('x-user', 'eve').expect(200);
    expect(await tokensOf(scenario.client, key)).toBeCloseTo(4, 2);
    // Downgrade: 4 tokens capped at 2, one taken.
    store.plans.set('eve', { capacity: 2, refillPerSecond: 0.001 });
    const down = await request(url).get('/dyn/resolved').set('x-user', 'eve').expect(200);
    expect(down.headers['ratelimit-remaining']).toBe('1');
    expect(await tokensOf(scenario.client, key)).toBeCloseTo(1, 2);
    // Upgrade: the bucket is not topped up.
    store.plans.set('eve', { capacity: 5, refillPerSecond: 0.001 });
    expect((await request(url).get('/dyn/resolved').set('x-user', 'eve').expect(200)).headers['ratelimit-remaining']).toBe('0');
    await request(url).get('/dyn/resolved').set('x-user', 'eve').expect(429);
    // The deny cache now holds the refusal under the slow plan; a plan that refills in milliseconds is asked for again.
    await request(url).get('/dyn/resolved').set('x-user', 'eve').expect(429);
    store.plans.set('eve', { capacity: 5, refillPerSecond: 1000 });
    await new Promise((resolve) => setTimeout(resolve, 20));
    await request(url).get('/dyn/resolved').set('x-user', 'eve').expect(200);
  });

  it('uses the static fallback when the resolver throws or hangs, logged once each', async () => {
    // How soon a hanging resolver is given up (timeoutMs) is a wall-clock claim: resolver-deadline.e2e-spec.ts
    // (timing project) holds it.
    const { url } = await start({ timeoutMs: 150 });
    logs.clear();
    await request(url).get('/dyn/throwing').expect(200);
    await request(url).get('/dyn/throwing').expect(429);
    const since = performance.now();
    await request(url).get('/dyn/hanging').expect(200);
    const denied = await request(url).get('/dyn/hanging').expect(429);
    // The fallback's 1 token at 1/1000 s: 1000 s, counted down from the first request (each waits out the
    // resolver's deadline; a loaded machine made the two take 2 s: 998).
    expectCountdown(denied.headers['retry-after'], 1000, since);
    const warned = logs.of('RateLimit', 'warn');
    expect(warned.filter((m) => m.includes('PerRequestController.throwing'))).toHaveLength(1);
    expect(warned.find((m) => m.includes('PerRequestController.throwing'))).toContain('plan service down');
    expect(warned.filter((m) => m.includes('PerRequestController.hanging'))).toHaveLength(1);
  });

  it('refuses with 500 when a resolver without fallback answers an invalid capacity', async () => {
    const { url } = await start();
    await request(url).get('/dyn/invalid').expect(500);
  });
});

describe('per-request limits at start-up', () => {
  it('fails the start naming the route when a resolver cannot be built', async () => {
    class Missing {}
    class NeedsMissing {
      constructor(readonly missing: Missing) {}
      resolve() {
        return { capacity: 1, refillPerSecond: 1 };
      }
    }
    Reflect.defineMetadata('design:paramtypes', [Missing], NeedsMissing);
    Reflect.defineMetadata('__injectable__', true, NeedsMissing);
    @Controller('broken')
    class BrokenController {
      @Get()
      @RateLimit({ resolve: NeedsMissing })
      get() {
        return {};
      }
    }
    @Module({ imports: [RateLimitModule.forRoot({ store: 'memory' })], controllers: [BrokenController] })
    class BrokenModule {}
    const moduleRef = await Test.createTestingModule({ imports: [BrokenModule] }).compile();
    const app = moduleRef.createNestApplication({ logger: false });
    await expect(app.init()).rejects.toThrow(/@RateLimit resolve: NeedsMissing on BrokenController\.get could not be created/);
    await app.close().catch(() => undefined);
  });

  it.each([
    [
      'a resolve that is not a resolver class',
      { resolve: class NotAResolver {} },
      /resolve must be a class with a resolve\(identity, context\) method .* on XController\.get/,
    ],
    [
      'functions beside resolve',
      {
        resolve: class R {
          resolve() {}
        },
        capacity: () => 1,
      },
      /with resolve takes numbers, not functions/,
    ],
    [
      'a fallback with half its numbers',
      {
        resolve: class R {
          resolve() {}
        },
        capacity: 5,
      },
      /refillPerSecond must be a finite number > 0 .* on XController\.get \(fallback of resolve\)/,
    ],
    [
      'a fixed capacity beside a function that is not an integer',
      { capacity: 2.5, refillPerSecond: () => 1 },
      /capacity must be an integer from 1 to 1000000000000 or a function \(got 2\.5\) on XController\.get/,
    ],
    ['a blockSeconds of 0', { capacity: 1, refillPerSecond: 1, blockSeconds: 0 }, /blockSeconds must be a number > 0/],
    [
      'refundOn that is neither',
      { capacity: 1, refillPerSecond: 1, refundOn: 'always' },
      /refundOn must be 'success', 'failure' or a function/,
    ],
  ])('fails the start naming the route for %s', async (_name, policy, message) => {
    @Controller('x')
    class XController {
      @Get()
      @RateLimit(policy as never)
      get() {
        return {};
      }
    }
    @Module({ imports: [RateLimitModule.forRoot({ store: 'memory' })], controllers: [XController] })
    class XModule {}
    const moduleRef = await Test.createTestingModule({ imports: [XModule] }).compile();
    const app = moduleRef.createNestApplication({ logger: false });
    await expect(app.init()).rejects.toThrow(message);
    await app.close().catch(() => undefined);
  });
});
