import { Controller, Get, Module, type Type } from '@nestjs/common';
import {
  BucketService,
  ConcurrencyLimit,
  type ConcurrencyLimitOptions,
  RateLimitModule,
  type RateLimitModuleOptions,
} from 'nest-redis-rate-limit';
import type { BucketStore } from 'nest-redis-rate-limit';
import { Test } from '@nestjs/testing';
import { redisUrl, testPrefix } from '../../support/redis.js';
import { startUp } from '../../support/start-up.js';

/**
 * @ConcurrencyLimit mistakes stop the start (issue 36, item 5), naming the route; so does a store
 * without slots under a route that needs them. Nothing here reaches a request.
 */
function jobsController(decorators: (ClassDecorator & MethodDecorator)[], on: 'handler' | 'class' = 'handler'): Type {
  class JobsController {
    run() {
      return 'ran';
    }
  }
  const proto = JobsController.prototype;
  const descriptor = Object.getOwnPropertyDescriptor(proto, 'run')!;
  Get('run')(proto, 'run', descriptor);
  if (on === 'handler') for (const d of [...decorators].reverse()) d(proto, 'run', descriptor);
  else for (const d of [...decorators].reverse()) d(JobsController);
  Controller('jobs')(JobsController);
  return JobsController;
}

async function appWith(controller: Type, options: Partial<RateLimitModuleOptions> = {}): Promise<Type> {
  const store = options.store !== undefined;
  @Module({
    imports: store
      ? [RateLimitModule.forRoot(options as RateLimitModuleOptions)]
      : [
          RateLimitModule.forRoot({
            redis: await redisUrl(),
            keyPrefix: testPrefix('concurrency-config'),
            ...options,
          } as RateLimitModuleOptions),
        ],
    controllers: [controller],
  })
  class ConcurrencyConfigModule {}
  return ConcurrencyConfigModule;
}

const on = 'on JobsController.run';
const limit = (options: Partial<Record<keyof ConcurrencyLimitOptions, unknown>>) =>
  ConcurrencyLimit({ limit: 2, ...options } as ConcurrencyLimitOptions);

describe('@ConcurrencyLimit mistakes stop the start and name the route', () => {
  it.each([
    ['limit 0', ConcurrencyLimit(0), `@ConcurrencyLimit limit must be an integer from 1 to 10000 (got 0) ${on}`],
    ['limit 2.5', limit({ limit: 2.5 }), `@ConcurrencyLimit limit must be an integer from 1 to 10000 (got 2.5) ${on}`],
    ['limit 10001', limit({ limit: 10_001 }), `@ConcurrencyLimit limit must be an integer from 1 to 10000 (got 10001) ${on}`],
    ['limit "5"', limit({ limit: '5' }), `@ConcurrencyLimit limit must be an integer from 1 to 10000 (got "5") ${on}`],
    [
      'keyBy "session"',
      limit({ keyBy: 'session' }),
      `@ConcurrencyLimit keyBy must be 'ip', 'user', 'apiKey' or a function (got "session") ${on}`,
    ],
    [
      'name with a space',
      limit({ name: 'a b' }),
      `@ConcurrencyLimit name must be 1-64 characters of A-Z a-z 0-9 . _ : @ - (got "a b") ${on}`,
    ],
    ['leaseMs 99', limit({ leaseMs: 99 }), `@ConcurrencyLimit leaseMs must be an integer from 100 to 3600000 (got 99) ${on}`],
    [
      'maxWaitMs 600001',
      limit({ maxWaitMs: 600_001 }),
      `@ConcurrencyLimit maxWaitMs must be an integer from 0 to 600000 (got 600001) ${on}`,
    ],
    [
      'a misspelled key',
      limit({ maxWait: 100 } as never),
      `@ConcurrencyLimit unknown key "maxWait" in the options (did you mean "maxWaitMs"?) ${on}`,
    ],
  ])('%s', async (_case, decorator, message) => {
    expect(await startUp(await appWith(jobsController([decorator])))).toEqual({ phase: 'init', message });
  });

  it('refuses two on one route, and names the route of a class-level one', async () => {
    expect(await startUp(await appWith(jobsController([ConcurrencyLimit(1), ConcurrencyLimit(2)])))).toEqual({
      phase: 'init',
      message: `2 @ConcurrencyLimit decorators ${on}: a route has one (a handler's replaces its controller's)`,
    });
    expect(await startUp(await appWith(jobsController([ConcurrencyLimit(0)], 'class')))).toEqual({
      phase: 'init',
      message: `@ConcurrencyLimit limit must be an integer from 1 to 10000 (got 0) ${on}`,
    });
  });

  it('refuses routes that share a name with different limits or leases, naming both', async () => {
    class OtherController {
      run() {
        return 'ran';
      }
    }
    const descriptor = Object.getOwnPropertyDescriptor(OtherController.prototype, 'run')!;
    Get('other')(OtherController.prototype, 'run', descriptor);
    ConcurrencyLimit({ limit: 3, name: 'exports' })(OtherController.prototype, 'run', descriptor);
    Controller('other')(OtherController);
    @Module({
      imports: [RateLimitModule.forRoot({ redis: await redisUrl(), keyPrefix: testPrefix('concurrency-config') })],
      controllers: [jobsController([limit({ name: 'exports' })]), OtherController],
    })
    class SharedNameModule {}
    expect(await startUp(SharedNameModule)).toEqual({
      phase: 'init',
      message:
        '@ConcurrencyLimit named "exports" on OtherController.run has limit 3 and leaseMs 30000, but on JobsController.run ' +
        'limit 2 and leaseMs 30000: routes that share slots must agree on both',
    });
  });

  it('refuses a store without slots under a route that needs them, and BucketService.takeSlot() on it', async () => {
    const bare: BucketStore = {
      remote: false,
      take: (requests) => Promise.resolve({ allowed: true, tokens: requests.map((r) => r.capacity - r.cost) }),
      delete: () => Promise.resolve(),
    };
    expect(await startUp(await appWith(jobsController([ConcurrencyLimit(1)]), { store: bare }))).toEqual({
      phase: 'init',
      message: `@ConcurrencyLimit ${on}: the module's store has no concurrency slots (takeSlot and giveBackSlot)`,
    });
    const moduleRef = await Test.createTestingModule({ imports: [RateLimitModule.forRoot({ store: bare })] }).compile();
    moduleRef.useLogger(false);
    await moduleRef.init();
    await expect(moduleRef.get(BucketService).takeSlot('jobs', { limit: 1 })).rejects.toMatchObject({
      code: 'ERR_RATE_LIMIT_CONCURRENCY_UNSUPPORTED',
    });
    await moduleRef.close();
  });

  it('starts with a valid one', async () => {
    expect(await startUp(await appWith(jobsController([limit({ keyBy: 'user', leaseMs: 100, maxWaitMs: 0, name: 'jobs' })])))).toEqual({
      phase: 'started',
    });
  });
});
