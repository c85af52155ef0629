import { Controller, Get, type INestApplication, Injectable, Logger, Module } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import request from 'supertest';
import { BucketService, RateLimit, RateLimitModule, type RateLimitPolicy } from 'nest-redis-rate-limit';
import { createApp } from '../../support/app.js';
import { LogRecorder } from '../../support/log-recorder.js';
import { redisUrl } from '../../support/redis.js';
import { redisScenario } from '../../support/scenario.js';
import { PrioritiesController } from './priorities.controller.js';

/**
 * Priority reserves (issue 36, item 2) over HTTP: each level goes as deep into the bucket as its reserve
 * allows, decided in the script's one call; the headers and Retry-After a request gets are those of its
 * own level. The memory store (store: 'memory', and failureMode 'local') gives the same answers.
 */
describe('priority reserves', () => {
  const scenario = redisScenario('priorities', { restoreLogger: true });

  async function start(store: 'redis' | 'memory'): Promise<INestApplication> {
    const keyPrefix = scenario.nextKeyPrefix();
    const url = await redisUrl();
    @Module({
      imports: [RateLimitModule.forRoot(store === 'redis' ? { redis: url, keyPrefix } : { store: 'memory', keyPrefix })],
      controllers: [PrioritiesController],
    })
    class PrioritiesModule {}
    return scenario.track(await createApp(PrioritiesModule, 'express'));
  }

  /** Status, remaining, Retry-After (or '-') and limit of one request. */
  async function hit(app: INestApplication, level: string, header?: string): Promise<string> {
    const call = request(app.getHttpServer()).get(`/priorities/${level}`);
    const response = await (header === undefined ? call : call.set('x-priority', header));
    const h = response.headers;
    return `${response.status} r=${h['x-ratelimit-remaining']} retry=${h['retry-after'] ?? '-'} limit=${h['x-ratelimit-limit']}`;
  }

  describe.each(['redis', 'memory'] as const)('store %s', (store) => {
    it('sheddable stops at 5 of 10 tokens, default at 2, critical at 0; each told its own remaining and Retry-After', async () => {
      const app = await start(store);
      const seen: string[] = [];
      for (let i = 0; i < 6; i++) seen.push(await hit(app, 'sheddable'));
      // Tokens 10 -> 5: remaining is what is above the sheddable floor (5); the 6th needs 6 tokens: (6 - 5) / 0.5 = 2 s.
      expect(seen).toEqual([
        '200 r=4 retry=- limit=10',
        '200 r=3 retry=- limit=10',
        '200 r=2 retry=- limit=10',
        '200 r=1 retry=- limit=10',
        '200 r=0 retry=- limit=10',
        '429 r=0 retry=2 limit=10',
      ]);
      // Default sees the 5 left as 3 above its floor of 2, takes 3 of them, then waits (3 - 2) / 0.5 = 2 s.
      const normal: string[] = [];
      for (let i = 0; i < 4; i++) normal.push(await hit(app, 'default'));
      expect(normal).toEqual([
        '200 r=2 retry=- limit=10',
        '200 r=1 retry=- limit=10',
        '200 r=0 retry=- limit=10',
        '429 r=0 retry=2 limit=10',
      ]);
      // Sheddable, refused meanwhile, is told the wait to 6 tokens from about 2: (6 - 2) / 0.5 = 8 s.
      expect(await hit(app, 'sheddable')).toBe('429 r=0 retry=8 limit=10');
      // Critical takes the last 2, then waits for 1 token: 2 s.
      const critical: string[] = [];
      for (let i = 0; i < 3; i++) critical.push(await hit(app, 'critical'));
      expect(critical).toEqual(['200 r=1 retry=- limit=10', '200 r=0 retry=- limit=10', '429 r=0 retry=2 limit=10']);
    });

    it("counts a priority function's hostile answers (a throw, a promise, a long or unknown string) as 'default', never an error", async () => {
      const recorder = new LogRecorder();
      const app = await start(store);
      Logger.overrideLogger(recorder);
      const statuses: number[] = [];
      for (const asked of ['throw', 'promise', 'huge', 'urgent', undefined]) {
        const call = request(app.getHttpServer()).get('/priorities/asked');
        statuses.push((await (asked === undefined ? call : call.set('x-priority', asked))).status);
      }
      // Capacity 4, default keeps 2: two requests, as 'default' gets; 'critical' would have had four.
      expect(statuses).toEqual([200, 200, 429, 429, 429]);
      expect(await hit(app, 'asked', 'critical')).toBe('200 r=1 retry=- limit=4');
      const warnings = recorder.of('RateLimit', 'warn');
      // Throttled: one line for the lot, and the long answer is not repeated in it.
      expect(warnings).toHaveLength(1);
      expect(warnings[0]).toMatch(
        /priority function of PrioritiesController\.asked threw \(no priority for you\): the request counts as 'default'/,
      );
      expect(warnings.join('').length).toBeLessThan(500);
    });
  });

  describe('BucketService', () => {
    @Injectable()
    class Holder {
      constructor(readonly buckets: BucketService) {}
    }

    async function service(): Promise<BucketService> {
      const keyPrefix = scenario.nextKeyPrefix();
      @Module({ imports: [RateLimitModule.forRoot({ redis: await redisUrl(), keyPrefix })], providers: [Holder] })
      class ServiceModule {}
      const app = scenario.track(await createApp(ServiceModule, 'express'));
      return app.get(Holder).buckets;
    }

    it('consume() with a priority leaves the reserve; peek() and acquire() refuse one', async () => {
      const buckets = await service();
      const policy = { capacity: 10, refillPerSecond: 0.001 };
      const shed = { ...policy, priority: 'sheddable' as const, reserve: 0.3 };
      const remaining: (number | boolean)[] = [];
      for (let i = 0; i < 8; i++) {
        const decision = await buckets.consume('exports', shed);
        remaining.push(decision.allowed && decision.remaining);
      }
      expect(remaining).toEqual([6, 5, 4, 3, 2, 1, 0, false]);
      const refused = await buckets.consume('exports', shed);
      expect(refused.retryAfterSeconds).toBeGreaterThan(900);
      // The default level of a priority-less policy keeps no reserve: the 3 left are its.
      expect((await buckets.consume('exports', policy, 3)).remaining).toBe(0);
      const all = await buckets.consumeAll([{ name: 'a', policy: { ...policy, priority: 'sheddable' } }]);
      expect(all.decisions[0].remaining).toBe(7);
      await expect(buckets.peek('exports', shed)).rejects.toMatchObject({ code: 'ERR_RATE_LIMIT_INVALID_POLICY' });
      await expect(buckets.acquire('exports', shed)).rejects.toMatchObject({ code: 'ERR_RATE_LIMIT_INVALID_POLICY' });
      await expect(buckets.consume('exports', { ...policy, priority: 'urgent' as 'critical' })).rejects.toMatchObject({
        code: 'ERR_RATE_LIMIT_INVALID_POLICY',
      });
    });
  });

  describe('start-up', () => {
    async function failure(policy: RateLimitPolicy, lease?: boolean): Promise<{ code?: string; message: string }> {
      @Controller('bad')
      class BadController {
        @Get()
        @RateLimit(policy)
        handle() {
          return {};
        }
      }
      @Module({
        imports: [RateLimitModule.forRoot({ store: 'memory', ...(lease === undefined ? {} : { lease }) })],
        controllers: [BadController],
      })
      class BadModule {}
      try {
        const moduleRef = await Test.createTestingModule({ imports: [BadModule] })
          .setLogger({ log() {}, error() {}, warn() {} })
          .compile();
        const app = moduleRef.createNestApplication({ logger: false });
        await app.init().finally(() => app.close());
      } catch (error) {
        return { code: (error as { code?: string }).code, message: (error as Error).message };
      }
      return { message: 'started' };
    }

    const base = { capacity: 10, refillPerSecond: 1 };
    it.each([
      [
        { ...base, priority: 'urgent' },
        'ERR_RATE_LIMIT_INVALID_POLICY',
        /priority must be 'critical', 'default' or 'sheddable' or a function/,
      ],
      [{ ...base, priority: 'sheddable', reserve: 1 }, 'ERR_RATE_LIMIT_INVALID_POLICY', /reserve must be a share from 0 to below 1/],
      [{ ...base, reserve: -0.1 }, 'ERR_RATE_LIMIT_INVALID_POLICY', /reserve must be/],
      [{ ...base, reserve: { sheddable: 0.1, default: 0.3 } }, 'ERR_RATE_LIMIT_INVALID_POLICY', /0 <= default <= sheddable < 1/],
      [{ ...base, reserve: { critical: 0.1 } }, 'ERR_RATE_LIMIT_UNKNOWN_OPTION', /reserve has no level "critical"/],
      [{ ...base, reserve: 'half' }, 'ERR_RATE_LIMIT_INVALID_POLICY', /reserve must be/],
      [{ ...base, priority: 'critical', lease: true }, 'ERR_RATE_LIMIT_LEASE_UNSUPPORTED', /lease cannot be used with priority or reserve/],
    ])('refuses %j with %s, naming the route', async (policy, code, wording) => {
      const { code: thrown, message } = await failure(policy as RateLimitPolicy);
      expect(thrown).toBe(code);
      expect(message).toMatch(wording);
      expect(message).toMatch(/BadController\.handle/);
    });

    it("refuses a priority on a route the module's lease applies to, and says how to opt out", async () => {
      const { code, message } = await failure({ ...base, priority: 'sheddable' }, true);
      expect(code).toBe('ERR_RATE_LIMIT_LEASE_UNSUPPORTED');
      expect(message).toMatch(/give it lease: false/);
      expect((await failure({ ...base, priority: 'sheddable', lease: false }, true)).message).toBe('started');
    });
  });
});
