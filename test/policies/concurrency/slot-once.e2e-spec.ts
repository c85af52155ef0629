import { Controller, Get, type INestApplication, Module, type Type, UseInterceptors } from '@nestjs/common';
import request from 'supertest';
import { ConcurrencyLimit, RateLimit, RateLimitInterceptor, RateLimitModule, type RateLimitModuleOptions } from 'nest-redis-rate-limit';
import { createApp } from '../../support/app.js';
import { redisUrl } from '../../support/redis.js';
import { redisScenario } from '../../support/scenario.js';

/**
 * One slot per request, however many times `RateLimitInterceptor` runs on it: a controller-level policy
 * that needs it and a handler's `@ConcurrencyLimit` each apply it, module `defaults` that need it put it
 * on globally, and an app may add it itself. A second slot taken by the same request would halve the
 * limit (with `limit: 1`, refuse every request).
 */

/** A controller-level policy decided after the guards (a keyBy function): it applies the interceptor to the class. */
@Controller('once')
@RateLimit({ capacity: 100, refillPerSecond: 1, keyBy: () => 'everyone', name: 'once-class' })
class ClassPolicyController {
  @Get('class')
  @ConcurrencyLimit({ limit: 1, name: 'once-class-slot' })
  classLevel() {
    return { ok: true };
  }

  /** The app's own @UseInterceptors(RateLimitInterceptor) as well. */
  @Get('own')
  @UseInterceptors(RateLimitInterceptor)
  @ConcurrencyLimit({ limit: 1, name: 'once-own-slot' })
  own() {
    return { ok: true };
  }
}

/** No policy of its own: module defaults (keyed by user) put the interceptor on globally. */
@Controller('once-defaults')
class DefaultsController {
  @Get()
  @ConcurrencyLimit({ limit: 1, name: 'once-defaults-slot' })
  get() {
    return { ok: true };
  }
}

describe('one concurrency slot per request, however often RateLimitInterceptor runs', () => {
  const scenario = redisScenario('slot-once');

  async function start(store: 'redis' | 'memory', controller: Type, extra: RateLimitModuleOptions = {}): Promise<INestApplication> {
    const keyPrefix = scenario.nextKeyPrefix();
    const base: RateLimitModuleOptions = store === 'redis' ? { redis: await redisUrl(), keyPrefix } : { store: 'memory', keyPrefix };
    @Module({ imports: [RateLimitModule.forRoot({ ...base, ...extra })], controllers: [controller] })
    class OnceModule {}
    return scenario.track(await createApp(OnceModule, 'express'));
  }

  /** Three requests one after the other: each finds the one slot free. */
  async function inTurn(app: INestApplication, path: string): Promise<string[]> {
    const answers: string[] = [];
    for (let i = 0; i < 3; i++) {
      const r = await request(app.getHttpServer()).get(path);
      answers.push(`${r.status} ${r.headers['concurrency-in-flight']}`);
    }
    return answers;
  }

  describe.each(['redis', 'memory'] as const)('store %s', (store) => {
    it('under a controller-level policy that applies the interceptor, and under the app’s own @UseInterceptors', async () => {
      const app = await start(store, ClassPolicyController);
      expect(await inTurn(app, '/once/class')).toEqual(['200 1', '200 1', '200 1']);
      expect(await inTurn(app, '/once/own')).toEqual(['200 1', '200 1', '200 1']);
    });

    it('under module defaults that put the interceptor on globally', async () => {
      const app = await start(store, DefaultsController, { defaults: { capacity: 100, refillPerSecond: 1, keyBy: 'user' } });
      expect(await inTurn(app, '/once-defaults')).toEqual(['200 1', '200 1', '200 1']);
    });
  });
});
