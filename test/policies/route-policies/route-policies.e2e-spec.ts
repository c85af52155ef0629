import { type INestApplication, Module } from '@nestjs/common';
import { Redis } from 'ioredis';
import request from 'supertest';
import { RateLimitModule, type RateLimitModuleOptions } from 'nest-redis-rate-limit';
import { createApp, PLATFORMS } from '../../support/app.js';
import { RedisServer, scriptCalls } from '../../support/redis.js';
import { ClassLimitedController, ClassSkippedController, OpenController } from './routes.controller.js';

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

describe.each(PLATFORMS)('which routes are limited, on %s', (platform) => {
  let app: INestApplication;
  const prefix = `routes-${platform}:`;

  async function start(options: RateLimitModuleOptions = {}) {
    @Module({
      imports: [RateLimitModule.forRoot({ redis: server.url, keyPrefix: prefix, ...options })],
      controllers: [OpenController, ClassLimitedController, ClassSkippedController],
    })
    class RoutesModule {}
    return createApp(RoutesModule, platform);
  }

  const hit = (path: string) => request(app.getHttpServer()).get(path);

  afterEach(async () => {
    await app.close();
    const keys = await client.keys(`${prefix}*`);
    if (keys.length) await client.del(...keys);
  });

  it('makes no Redis call for a route without a policy or under @SkipRateLimit', async () => {
    app = await start();
    const before = await scriptCalls(client);
    for (let i = 0; i < 10; i++) {
      const res = await hit('/open').expect(200);
      expect(res.headers['x-ratelimit-limit']).toBeUndefined();
      await hit('/class-limited/skipped').expect(200);
      await hit('/class-skipped').expect(200);
    }
    expect(await scriptCalls(client)).toBe(before);
    await hit('/class-limited/inherits').expect(200);
    expect(await scriptCalls(client)).toBe(before + 1);
  });

  it('lets handler policies replace the controller policy, and inherits it otherwise', async () => {
    app = await start();
    await hit('/class-limited/inherits').expect(200);
    await hit('/class-limited/inherits').expect(429);
    for (let i = 0; i < 3; i++) await hit('/class-limited/overrides').expect(200);
    const denied = await hit('/class-limited/overrides').expect(429);
    expect(denied.headers['x-ratelimit-limit']).toBe('3');
  });

  it('limits a handler that has its own policy inside a skipped controller', async () => {
    app = await start();
    await hit('/class-skipped/limited').expect(200);
    await hit('/class-skipped/limited').expect(200);
    await hit('/class-skipped/limited').expect(429);
  });

  it('applies module defaults to routes without a policy, but not to skipped ones', async () => {
    app = await start({ defaults: { capacity: 2, refillPerSecond: 0.01 } });
    await hit('/open').expect(200);
    const second = await hit('/open').expect(200);
    expect(second.headers['x-ratelimit-limit']).toBe('2');
    await hit('/open').expect(429);
    for (let i = 0; i < 5; i++) await hit('/class-skipped').expect(200);
  });
});
