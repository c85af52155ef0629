import { Controller, Get, type INestApplication, Logger, type Type } from '@nestjs/common';
import { Test, type TestingModuleBuilder } from '@nestjs/testing';
import { Redis } from 'ioredis';
import request from 'supertest';
import { RateLimit, RateLimitGuard, RateLimitModule } from 'nest-redis-rate-limit';
import { LogRecorder } from '../../support/log-recorder.js';
import { deleteKeys, keysUnder, redisUrl, testPrefix } from '../../support/redis.js';

/**
 * The guard the module puts in front of every route is a provider (`RateLimitGuard`), so @nestjs/testing's
 * `overrideProvider(RateLimitGuard)` replaces it: a stub that allows switches the limits off for that test
 * module, the interceptor's policies (keyed by a function, by user) included. `overrideGuard()` reaches
 * only guards applied with `@UseGuards()` (Nest's rule, for every global guard): the README says so.
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

describe('overrideProvider(RateLimitGuard) in a Nest testing module', () => {
  const prefix = testPrefix('override-provider');
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
    await start('off', (builder) => builder.overrideProvider(RateLimitGuard).useValue({ canActivate: () => true }), [
      ByIpController,
      ByFunctionController,
    ]);
    expect(await statuses('/by-ip', 5)).toEqual(Array(5).fill([200, null]));
    expect(await statuses('/by-function', 5)).toEqual(Array(5).fill([200, null]));
    expect(await keysUnder(client, `${prefix}off:`)).toEqual([]);
    expect(recorder.lines.filter((line) => line.level !== 'log')).toEqual([]);
  });

  it('overrideGuard(RateLimitGuard) does not reach the global guard (only @UseGuards() ones): limits stay on', async () => {
    await start('guard', (builder) => builder.overrideGuard(RateLimitGuard).useValue({ canActivate: () => true }), [ByIpController]);
    expect((await statuses('/by-ip', 3)).map(([status]) => status)).toEqual([200, 200, 429]);
  });

  it('guard: false registers no global guard, so an override has nothing to replace and the app starts only with its own guard in place', async () => {
    const builder = Test.createTestingModule({
      imports: [RateLimitModule.forRoot({ redis: await redisUrl(), keyPrefix: `${prefix}none:`, guard: false })],
      controllers: [ByIpController],
    })
      .overrideProvider(RateLimitGuard)
      .useValue({ canActivate: () => true });
    app = (await builder.compile()).createNestApplication({ logger: false });
    await expect(app.init()).rejects.toThrow('no RateLimitGuard runs on ByIpController.get');
  });

  it('a stub that refuses answers 403 on every route: the stub is the global guard', async () => {
    await start('deny', (builder) => builder.overrideProvider(RateLimitGuard).useValue({ canActivate: () => false }), [ByIpController]);
    expect(await statuses('/by-ip', 2)).toEqual([
      [403, null],
      [403, null],
    ]);
  });
});
