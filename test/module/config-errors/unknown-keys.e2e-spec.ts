import { ConsoleLogger, Controller, Get, Module, type Type } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { BucketService, RateLimit, RateLimitModule, type RateLimitModuleOptions, type RateLimitPolicy } from 'nest-redis-rate-limit';
import { startUp } from '../../support/start-up.js';

/**
 * Options are strict: a key the library does not read stops the start (or throws at the call), naming
 * the key, where it is and the known key it was probably meant to be. Before, `failuremode: 'closed'`,
 * `timeoutMS: 2000` or a policy variable's `keyby: 'user'` started without a word and left the defaults
 * in force (open mode, 100 ms, keyed by IP). No Redis is needed: every app here uses `store: 'memory'`.
 */
function appWith(options: Record<string, unknown>, controllers: Type[] = []): Type {
  @Module({ imports: [RateLimitModule.forRoot({ store: 'memory', ...options } as RateLimitModuleOptions)], controllers })
  class UnknownKeysAppModule {}
  return UnknownKeysAppModule;
}

describe('an unknown key in the module options stops the start while the module is built', () => {
  it.each([
    [{ failuremode: 'closed' }, 'RateLimitModule: unknown key "failuremode" in the options (did you mean "failureMode"?)'],
    [{ timeoutMS: 2000 }, 'RateLimitModule: unknown key "timeoutMS" in the options (did you mean "timeoutMs"?)'],
    [{ keyprefix: 'api:' }, 'RateLimitModule: unknown key "keyprefix" in the options (did you mean "keyPrefix"?)'],
    [{ standardHeader: false }, 'RateLimitModule: unknown key "standardHeader" in the options (did you mean "standardHeaders"?)'],
    [{ keys: { apikeyHeader: 'x-key' } }, 'RateLimitModule: unknown key "apikeyHeader" in keys (did you mean "apiKeyHeader"?)'],
    [{ keys: { userId: () => '1' } }, 'RateLimitModule: unknown key "userId" in keys (did you mean "user"?)'],
    [{ allowList: { ip: ['10.0.0.1'] } }, 'RateLimitModule: unknown key "ip" in allowList (did you mean "ips"?)'],
    [{ acquire: { maxWait: 5000 } }, 'RateLimitModule: unknown key "maxWait" in acquire (did you mean "maxWaitMs"?)'],
    [{ acquire: { maxWaiting: 5, ttl: 1 } }, 'RateLimitModule: unknown key "ttl" in acquire (known keys: maxWaitMs, maxWaiting)'],
  ])('refuses %j', async (options, message) => {
    expect(await startUp(appWith(options))).toEqual({ phase: 'compile', message });
  });

  it('gives every unknown key the code ERR_RATE_LIMIT_UNKNOWN_OPTION', async () => {
    const compiling = Test.createTestingModule({ imports: [appWith({ failuremode: 'closed' })] })
      .setLogger(new ConsoleLogger({ logLevels: [] }))
      .compile();
    await expect(compiling).rejects.toMatchObject({
      name: 'RateLimitConfigError',
      code: 'ERR_RATE_LIMIT_UNKNOWN_OPTION',
      reason: 'RateLimitModule: unknown key "failuremode" in the options (did you mean "failureMode"?)',
    });
  });

  it('lists the known keys when no key is close to the unknown one', async () => {
    const result = await startUp(appWith({ ttl: 60 }));
    expect(result).toEqual({
      phase: 'compile',
      message:
        'RateLimitModule: unknown key "ttl" in the options (known keys: redis, store, keyPrefix, failureMode, timeoutMs, ' +
        'legacyHeaders, standardHeaders, keys, defaults, denyCache, coalesce, guard, enforce, lease, skipIf, allowList, onDecision, ' +
        'resolverCacheMs, maxLocalBuckets, metrics, startupCheck, acquire, operations)',
    });
  });

  it('refuses an unknown key in the object a forRootAsync factory returns', async () => {
    @Module({
      imports: [RateLimitModule.forRootAsync({ useFactory: async () => ({ store: 'memory', timeoutMS: 2000 }) as RateLimitModuleOptions })],
    })
    class AsyncUnknownKeyModule {}
    expect(await startUp(AsyncUnknownKeyModule)).toEqual({
      phase: 'compile',
      message: 'RateLimitModule: unknown key "timeoutMS" in the options (did you mean "timeoutMs"?)',
    });
  });

  it('still takes isGlobal beside the options of forRoot', async () => {
    @Module({ imports: [RateLimitModule.forRoot({ store: 'memory', isGlobal: true })] })
    class GlobalModule {}
    expect(await startUp(GlobalModule)).toEqual({ phase: 'started' });
  });
});

describe('an unknown key in a policy stops app.init(), naming the route', () => {
  function reportsController(decorator: MethodDecorator): Type {
    @Controller('reports')
    class ReportsController {
      @Get()
      @decorator
      list() {
        return [];
      }
    }
    return ReportsController;
  }

  it('refuses a policy kept in a variable, which TypeScript does not check for excess keys', async () => {
    const policy = { capacity: 5, refillPerSecond: 1, keyby: 'user' };
    const result = await startUp(appWith({}, [reportsController(RateLimit(policy))]));
    expect(result).toEqual({
      phase: 'init',
      message: '@RateLimit unknown key "keyby" in the policy (did you mean "keyBy"?) on ReportsController.list',
    });
  });

  it('refuses a misspelled key of the decorator object form', async () => {
    const result = await startUp(
      appWith({}, [reportsController(RateLimit({ capacity: 5, refillPerSecond: 1, refund: 'success' } as RateLimitPolicy))]),
    );
    expect(result).toEqual({
      phase: 'init',
      message: '@RateLimit unknown key "refund" in the policy (did you mean "refundOn"?) on ReportsController.list',
    });
  });

  it('refuses an unknown key in the module defaults, saying where it is', async () => {
    const result = await startUp(
      appWith({
        defaults: [
          { capacity: 5, refillPerSecond: 1 },
          { capacity: 5, refillPerSecond: 1, Cost: 2 },
        ],
      }),
    );
    expect(result).toEqual({
      phase: 'init',
      message: 'RateLimitModule defaults[1] unknown key "Cost" in the policy (did you mean "cost"?) on the module options',
    });
  });
});

describe('an unknown key in a BucketService call throws at the call', () => {
  let buckets: BucketService;
  let close: () => Promise<void>;

  beforeAll(async () => {
    const moduleRef = await Test.createTestingModule({ imports: [RateLimitModule.forRoot({ store: 'memory' })] })
      .setLogger(new ConsoleLogger({ logLevels: [] }))
      .compile();
    await moduleRef.init();
    buckets = moduleRef.get(BucketService);
    close = () => moduleRef.close();
  });
  afterAll(() => close());

  it('refuses a policy key of a route policy, which a bucket of BucketService does not read', async () => {
    const policy = { capacity: 5, refillPerSecond: 1, keyBy: 'user' };
    await expect(buckets.consume('export', policy)).rejects.toThrow(
      'BucketService unknown key "keyBy" in the policy (known keys: capacity, refillPerSecond) on BucketService bucket "export"',
    );
    await expect(buckets.peek('export', { capacity: 5, refillPerSecond: 1, refilPerSecond: 2 } as never)).rejects.toThrow(
      'BucketService unknown key "refilPerSecond" in the policy (did you mean "refillPerSecond"?) on BucketService bucket "export"',
    );
  });

  it('refuses an unknown key of a consumeAll() entry', async () => {
    const entry = { name: 'export', policy: { capacity: 5, refillPerSecond: 1 }, cots: 2 };
    await expect(buckets.consumeAll([entry])).rejects.toThrow(
      'BucketService unknown key "cots" in the entry (did you mean "cost"?) on BucketService bucket "export"',
    );
    await expect(buckets.consumeAll([entry])).rejects.toMatchObject({ code: 'ERR_RATE_LIMIT_UNKNOWN_OPTION' });
  });

  it('takes nothing from the bucket when it refuses', async () => {
    await expect(buckets.consume('untouched', { capacity: 2, refillPerSecond: 1, Capacity: 1 } as never)).rejects.toThrow(
      'did you mean "capacity"?',
    );
    expect((await buckets.peek('untouched', { capacity: 2, refillPerSecond: 1 })).remaining).toBe(2);
  });
});
