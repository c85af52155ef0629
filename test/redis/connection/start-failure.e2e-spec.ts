import { Controller, Get, Injectable, Module, type Type } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { Redis } from 'ioredis';
import { RateLimit, RateLimitModule, type RateLimitModuleOptions } from 'nest-redis-rate-limit';
import { redisUrl, testPrefix } from '../../support/redis.js';

/**
 * An application whose start fails on one of the module's own checks must not keep a Redis connection
 * open: `bootstrap().catch(log)` would otherwise leave a process that neither serves nor exits. Each
 * case names its connection and looks for it in CLIENT LIST after `init()` rejected, without
 * `app.close()` (which a failed bootstrap never reaches).
 */
describe('a start that fails on a rate-limit check', () => {
  const prefix = testPrefix('start-failure');
  let admin: Redis;
  let cases = 0;

  beforeAll(async () => {
    admin = new Redis(await redisUrl());
  });
  afterAll(async () => {
    admin.disconnect();
  });

  /** The connections named `name` that Redis still holds, polled for up to a second. */
  async function connectionsNamed(name: string): Promise<number> {
    const deadline = Date.now() + 1000;
    for (;;) {
      const list = String(await admin.client('LIST'));
      const count = list.split('\n').filter((line) => line.includes(` name=${name} `)).length;
      if (count === 0 || Date.now() > deadline) return count;
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
  }

  async function failedStart(controller: Type, options: RateLimitModuleOptions, message: RegExp): Promise<string> {
    const name = `${prefix.replace(/[^A-Za-z0-9-]/g, '-')}${cases++}`;
    const url = new URL(await redisUrl());
    @Module({
      imports: [
        RateLimitModule.forRoot({
          redis: { host: url.hostname, port: Number(url.port || 6379), connectionName: name },
          keyPrefix: prefix,
          ...options,
        }),
      ],
      controllers: [controller],
    })
    class AppModule {}
    const moduleRef = await Test.createTestingModule({ imports: [AppModule] }).compile();
    const app = moduleRef.createNestApplication({ logger: false });
    await expect(app.init()).rejects.toThrow(message);
    return name;
  }

  it('has a connection while it runs (the check below can see one)', async () => {
    const name = `${prefix.replace(/[^A-Za-z0-9-]/g, '-')}running`;
    const url = new URL(await redisUrl());
    const moduleRef = await Test.createTestingModule({
      imports: [
        RateLimitModule.forRoot({ redis: { host: url.hostname, port: Number(url.port || 6379), connectionName: name }, keyPrefix: prefix }),
      ],
    }).compile();
    const app = moduleRef.createNestApplication({ logger: false });
    await app.init();
    const list = String(await admin.client('LIST'));
    expect(list.split('\n').filter((line) => line.includes(` name=${name} `))).toHaveLength(1);
    await app.close();
    expect(await connectionsNamed(name)).toBe(0);
  });

  it('closes its connection when a resolver cannot be built', async () => {
    class Missing {}
    @Injectable()
    class NeedsMissing {
      constructor(readonly missing: Missing) {}
      resolve() {
        return { capacity: 1, refillPerSecond: 1 };
      }
    }
    @Controller('broken')
    class BrokenController {
      @Get()
      @RateLimit({ resolve: NeedsMissing })
      get() {
        return {};
      }
    }
    const name = await failedStart(BrokenController, {}, /NeedsMissing on BrokenController\.get could not be created/);
    expect(await connectionsNamed(name)).toBe(0);
  });

  it('closes its connection when guard: false leaves a limited route without a guard', async () => {
    @Controller('unguarded')
    class UnguardedController {
      @Get()
      @RateLimit(2, 1)
      get() {
        return {};
      }
    }
    const name = await failedStart(UnguardedController, { guard: false }, /UnguardedController\.get/);
    expect(await connectionsNamed(name)).toBe(0);
  });

  it('leaves no connection when a policy is invalid', async () => {
    @Controller('invalid')
    class InvalidController {
      @Get()
      @RateLimit(2.5, 1)
      get() {
        return {};
      }
    }
    const name = await failedStart(InvalidController, {}, /InvalidController\.get/);
    expect(await connectionsNamed(name)).toBe(0);
  });
});
