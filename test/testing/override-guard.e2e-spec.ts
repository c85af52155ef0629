import { Controller, Get, type INestApplication, Logger, type Type } from '@nestjs/common';
import { Test, type TestingModuleBuilder } from '@nestjs/testing';
import { Redis } from 'ioredis';
import request from 'supertest';
import { RateLimit, RateLimitGuard, RateLimitModule } from 'nest-redis-rate-limit';
import { LogRecorder } from '../support/log-recorder.js';
import { deleteKeys, keysUnder, redisUrl, testPrefix } from '../support/redis.js';

/**
 * @nestjs/testing's `overrideGuard(RateLimitGuard)` replaces the guard the module puts in front of every
 * route, as `overrideGuard(ThrottlerGuard)` does for @nestjs/throttler: a stub that allows switches the
 * limits off for that test module, the interceptor's policies (keyed by user) included.
 */

@Controller('by-ip')
@RateLimit(2, 1 / 3600)
class ByIpController {
  @Get()
  get() {
    return 'ip';
  }
}

@Controller('by-function')
@RateLimit({ capacity: 2, refillPerSecond: 1 / 3600, keyBy: (ctx) => `caller:${ctx.switchToHttp().getRequest().headers['x-caller']}` })
class ByFunctionController {
  @Get()
  get() {
    return 'function';
  }
}

describe('overrideGuard(RateLimitGuard) in a Nest testing module', () => {
  const prefix = testPrefix('override-guard');
  const recorder = new LogRecorder();
  let client: Redis;
  let app: INestApplication | undefined;

  async function start(name: string, override: (builder: TestingModuleBuilder) => TestingModuleBuilder, controllers: Type[]) {
    const builder = Test.createTestingModule({
      imports: [RateLimitModule.forRoot({ redis: await redisUrl(), keyPrefix: `${prefix}${name}:` })],
      controllers,
    });
    app = (await override(builder).compile()).createNestApplication({ logger: false });
    await app.init();
    Logger.overrideLogger(recorder);
    recorder.clear();
    return app;
  }
  const statuses = async (path: string, times: number) => {
    const answers = [];
    for (let i = 0; i < times; i++) {
      const response = await request(app!.getHttpServer()).get(path).set('x-caller', 'alice');
      answers.push([response.status, response.headers['x-ratelimit-remaining'] ?? null]);
    }
    return answers;
  };

  beforeAll(async () => {
    client = new Redis(await redisUrl());
  });
  afterEach(async () => {
    Logger.overrideLogger(false);
    await app?.close();
    app = undefined;
  });
  afterAll(async () => {
    await deleteKeys(client, prefix);
    await client.quit();
  });

  it('without an override, limits both routes: 200, 200, then 429', async () => {
    await start('plain', (builder) => builder, [ByIpController, ByFunctionController]);
    const limited = [
      [200, '1'],
      [200, '0'],
      [429, '0'],
    ];
    expect(await statuses('/by-ip', 3)).toEqual(limited);
    expect(await statuses('/by-function', 3)).toEqual(limited);
  });

  it('useValue({ canActivate: () => true }) lets 5 of 5 through on an IP-keyed and a function-keyed route, without headers, keys or warnings', async () => {
    await start('off', (builder) => builder.overrideGuard(RateLimitGuard).useValue({ canActivate: () => true }), [
      ByIpController,
      ByFunctionController,
    ]);
    expect(await statuses('/by-ip', 5)).toEqual(Array(5).fill([200, null]));
    expect(await statuses('/by-function', 5)).toEqual(Array(5).fill([200, null]));
    expect(await keysUnder(client, `${prefix}off:`)).toEqual([]);
    expect(recorder.lines.filter((line) => line.level !== 'log')).toEqual([]);
  });

  it('a stub that refuses refuses every route with 403, as the replaced guard would be used', async () => {
    await start('deny', (builder) => builder.overrideGuard(RateLimitGuard).useValue({ canActivate: () => false }), [ByIpController]);
    expect(await statuses('/by-ip', 2)).toEqual([
      [403, null],
      [403, null],
    ]);
  });
});
