import { Controller, Get, Module, type Type, UseGuards } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import {
  RATE_LIMIT_ERROR_CODES,
  RateLimit,
  RateLimitConfigError,
  RateLimitGuard,
  RateLimitModule,
  type RateLimitErrorCode,
  type RateLimitModuleOptions,
  type RateLimitPolicy,
} from 'nest-redis-rate-limit';
import { redisUrl, testPrefix } from '../../support/redis.js';
import { startUp } from '../../support/start-up.js';

/**
 * Every configuration mistake stops the application while it starts, with a message that says what
 * to change and, for a policy, on which controller and handler. Nothing here reaches a request.
 */
/** `ReportsController` with one route, `list`, decorated by `decorate` (on the handler, or on the class). */
function reportsController(decorate: (ClassDecorator & MethodDecorator)[], on: 'handler' | 'class' = 'handler'): Type {
  class ReportsController {
    list() {
      return [];
    }
    other() {
      return [];
    }
  }
  const proto = ReportsController.prototype;
  for (const name of ['list', 'other'] as const) {
    const descriptor = Object.getOwnPropertyDescriptor(proto, name)!;
    Get(name)(proto, name, descriptor);
    if (on === 'handler' && name === 'list') for (const d of [...decorate].reverse()) d(proto, name, descriptor);
  }
  if (on === 'class') for (const d of [...decorate].reverse()) d(ReportsController);
  Controller('reports')(ReportsController);
  return ReportsController;
}

async function appWith(controller: Type | undefined, options: Partial<RateLimitModuleOptions> = {}): Promise<Type> {
  @Module({
    imports: [RateLimitModule.forRoot({ redis: await redisUrl(), keyPrefix: testPrefix('config-errors'), ...options })],
    controllers: controller ? [controller] : [],
  })
  class ConfigErrorsAppModule {}
  return ConfigErrorsAppModule;
}

const on = 'on ReportsController.list';
const policy = (overrides: Partial<Record<keyof RateLimitPolicy, unknown>>) =>
  RateLimit({ capacity: 10, refillPerSecond: 1, ...overrides } as RateLimitPolicy);

describe('policy errors stop app.init() and name the controller and handler', () => {
  it.each([
    ['capacity 0', policy({ capacity: 0 }), `@RateLimit capacity must be an integer >= 1 (got 0) ${on}`],
    ['capacity -1', policy({ capacity: -1 }), `@RateLimit capacity must be an integer >= 1 (got -1) ${on}`],
    ['capacity 2.5', policy({ capacity: 2.5 }), `@RateLimit capacity must be an integer >= 1 (got 2.5) ${on}`],
    ['capacity NaN', policy({ capacity: NaN }), `@RateLimit capacity must be an integer >= 1 (got NaN) ${on}`],
    ['capacity "10"', policy({ capacity: '10' }), `@RateLimit capacity must be an integer >= 1 (got "10") ${on}`],
    ['capacity 0 in the short form', RateLimit(0, 1), `@RateLimit capacity must be an integer >= 1 (got 0) ${on}`],
    ['refill 0', policy({ refillPerSecond: 0 }), `@RateLimit refillPerSecond must be a finite number > 0 (got 0) ${on}`],
    ['refill -2', policy({ refillPerSecond: -2 }), `@RateLimit refillPerSecond must be a finite number > 0 (got -2) ${on}`],
    ['refill NaN', policy({ refillPerSecond: NaN }), `@RateLimit refillPerSecond must be a finite number > 0 (got NaN) ${on}`],
    [
      'refill Infinity',
      policy({ refillPerSecond: Infinity }),
      `@RateLimit refillPerSecond must be a finite number > 0 (got Infinity) ${on}`,
    ],
    [
      'refill missing',
      RateLimit(5, undefined as unknown as number),
      `@RateLimit refillPerSecond must be a finite number > 0 (got undefined) ${on}`,
    ],
    ['cost above capacity', policy({ cost: 11 }), `@RateLimit cost must be an integer from 1 to capacity 10 (got 11) ${on}`],
    ['cost 0', policy({ cost: 0 }), `@RateLimit cost must be an integer from 1 to capacity 10 (got 0) ${on}`],
    ['cost -1', policy({ cost: -1 }), `@RateLimit cost must be an integer from 1 to capacity 10 (got -1) ${on}`],
    ['cost 1.5', policy({ cost: 1.5 }), `@RateLimit cost must be an integer from 1 to capacity 10 (got 1.5) ${on}`],
    [
      'keyBy "session"',
      policy({ keyBy: 'session' }),
      `@RateLimit keyBy must be 'ip', 'user', 'apiKey' or a function (got "session") ${on}`,
    ],
    ['keyBy "IP"', policy({ keyBy: 'IP' }), `@RateLimit keyBy must be 'ip', 'user', 'apiKey' or a function (got "IP") ${on}`],
    [
      'keyBy "api-key"',
      RateLimit(10, 1, 'api-key' as 'apiKey'),
      `@RateLimit keyBy must be 'ip', 'user', 'apiKey' or a function (got "api-key") ${on}`,
    ],
  ])('%s', async (_case, decorator, message) => {
    expect(await startUp(await appWith(reportsController([decorator])))).toEqual({ phase: 'init', message });
  });

  it('refuses same-name policies whose costs cannot fit one bucket when their identities meet', async () => {
    const stacked = [policy({ capacity: 1, name: 'shared', keyBy: 'apiKey' }), policy({ capacity: 1, name: 'shared', keyBy: 'ip' })];
    expect(await startUp(await appWith(reportsController(stacked)))).toEqual({
      phase: 'init',
      message:
        '@RateLimit policies named "shared" on ReportsController.list can meet on one bucket (a client without a user ' +
        'or API key falls back to its IP) and then need 2 tokens of a bucket of 1, so they would refuse it forever: ' +
        'give them different names, or costs that fit',
    });
  });

  it('names the first route of a controller whose class-level policy is invalid', async () => {
    const result = await startUp(await appWith(reportsController([policy({ capacity: 0 })], 'class')));
    expect(result).toEqual({ phase: 'init', message: `@RateLimit capacity must be an integer >= 1 (got 0) ${on}` });
  });

  it('names the route when the second of two stacked policies is invalid', async () => {
    const result = await startUp(
      await appWith(reportsController([policy({ name: 'burst' }), policy({ name: 'quota', refillPerSecond: -1 })])),
    );
    expect(result).toEqual({
      phase: 'init',
      message: `@RateLimit refillPerSecond must be a finite number > 0 (got -1) ${on}`,
    });
  });

  it('says an invalid policy comes from the module option defaults, not from a decorator', async () => {
    const result = await startUp(await appWith(reportsController([]), { defaults: { capacity: 10, refillPerSecond: 1, cost: 20 } }));
    expect(result).toEqual({
      phase: 'init',
      message: 'RateLimitModule defaults[0] cost must be an integer from 1 to capacity 10 (got 20) on the module options',
    });
  });

  it('starts with the same controller once the policy is valid', async () => {
    expect(await startUp(await appWith(reportsController([policy({ cost: 10 })])))).toEqual({ phase: 'started' });
  });
});

describe('module option errors stop the start while the module is built, before app.init()', () => {
  it.each([
    [
      'a URL without scheme',
      { redis: 'localhost:6379' },
      'RateLimitModule: redis must be a redis:// or rediss:// URL (got "localhost:6379")',
    ],
    [
      'an http:// URL',
      { redis: 'http://127.0.0.1:6379' },
      'RateLimitModule: redis must be a redis:// or rediss:// URL (got "http://127.0.0.1:6379")',
    ],
    [
      'a port out of range',
      { redis: 'redis://127.0.0.1:99999' },
      'RateLimitModule: redis must be a redis:// or rediss:// URL (got "redis://127.0.0.1:99999")',
    ],
    ['no URL at all', { redis: 'not a url' }, 'RateLimitModule: redis must be a redis:// or rediss:// URL (got "not a url")'],
    [
      'standardHeaders "draft-9"',
      { standardHeaders: 'draft-9' },
      `RateLimitModule: standardHeaders must be one of 'draft-6', 'draft-7', 'draft-8', false (got "draft-9")`,
    ],
    [
      'standardHeaders "draft6"',
      { standardHeaders: 'draft6' },
      `RateLimitModule: standardHeaders must be one of 'draft-6', 'draft-7', 'draft-8', false (got "draft6")`,
    ],
    [
      'standardHeaders true',
      { standardHeaders: true },
      `RateLimitModule: standardHeaders must be one of 'draft-6', 'draft-7', 'draft-8', false (got true)`,
    ],
    [
      'failureMode "half-open"',
      { failureMode: 'half-open' },
      `RateLimitModule: failureMode must be one of 'open', 'closed', 'local' (got "half-open")`,
    ],
    ['timeoutMs 0', { timeoutMs: 0 }, 'RateLimitModule: timeoutMs must be a finite number > 0 (got 0)'],
    ['timeoutMs Infinity', { timeoutMs: Infinity }, 'RateLimitModule: timeoutMs must be a finite number > 0 (got Infinity)'],
    ['legacyHeaders "yes"', { legacyHeaders: 'yes' }, 'RateLimitModule: legacyHeaders must be true or false (got "yes")'],
    ['legacyHeaders 0', { legacyHeaders: 0 }, 'RateLimitModule: legacyHeaders must be true or false (got 0)'],
  ])('%s', async (_case, options, message) => {
    const result = await startUp(await appWith(reportsController([policy({})]), options as Partial<RateLimitModuleOptions>));
    expect(result).toEqual({ phase: 'compile', message });
  });

  it('rejects a bad option that forRootAsync computes, the same way', async () => {
    @Module({
      imports: [
        RateLimitModule.forRootAsync({
          useFactory: async () => ({ redis: await redisUrl(), standardHeaders: 'draft-5' as 'draft-6' }),
        }),
      ],
    })
    class AsyncConfigErrorsModule {}
    expect(await startUp(AsyncConfigErrorsModule)).toEqual({
      phase: 'compile',
      message: `RateLimitModule: standardHeaders must be one of 'draft-6', 'draft-7', 'draft-8', false (got "draft-5")`,
    });
  });
});

describe('registration mistakes stop the start with a message that names the fix', () => {
  it('refuses RateLimitModule.forRoot() imported by two feature modules, naming both', async () => {
    const url = await redisUrl();
    @Module({ imports: [RateLimitModule.forRoot({ redis: url, keyPrefix: testPrefix('config-errors') })] })
    class UsersModule {}
    @Module({ imports: [RateLimitModule.forRoot({ redis: url, keyPrefix: testPrefix('config-errors') })] })
    class OrdersModule {}
    @Module({ imports: [UsersModule, OrdersModule], controllers: [reportsController([policy({})])] })
    class TwiceAppModule {}
    const result = await startUp(TwiceAppModule);
    expect(result.phase).toBe('init');
    const message = result.phase === 'started' ? '' : result.message;
    expect(message).toMatch(
      /^RateLimitModule\.forRoot\(\) \/ forRootAsync\(\) is imported 2 times \(by (UsersModule, OrdersModule|OrdersModule, UsersModule)\)/,
    );
    expect(message).toContain('Import it once, in your root module, and add isGlobal: true');
  });

  it('refuses @RateLimit in an app that never imports RateLimitModule, naming the controller', async () => {
    @Module({ controllers: [reportsController([policy({})])] })
    class NoModuleAppModule {}
    expect(await startUp(NoModuleAppModule)).toEqual({
      phase: 'init',
      message:
        '@RateLimit (used on ReportsController) needs RateLimitModule, which this application does not import: ' +
        'add RateLimitModule.forRoot({ ... }) or RateLimitModule.forRootAsync({ ... }) to the imports of your root module',
    });
  });

  it('refuses @UseGuards(RateLimitGuard) in an app that never imports RateLimitModule', async () => {
    const controller = reportsController([]);
    UseGuards(RateLimitGuard)(controller);
    @Module({ controllers: [controller] })
    class GuardOnlyAppModule {}
    const result = await startUp(GuardOnlyAppModule);
    expect(result).toEqual({
      phase: 'init',
      message: expect.stringMatching(/^RateLimitGuard needs RateLimitModule, which this application does not import/),
    });
  });

  it('refuses a bare imports: [RateLimitModule], telling to call forRoot() or forRootAsync()', async () => {
    @Module({ imports: [RateLimitModule], controllers: [reportsController([policy({})])] })
    class BareAppModule {}
    expect(await startUp(BareAppModule)).toEqual({
      phase: 'compile',
      message:
        'RateLimitModule was imported without options: use RateLimitModule.forRoot({ ... }) or ' +
        'RateLimitModule.forRootAsync({ ... }) in the imports of your root module',
    });
  });

  it('starts with forRoot() and no options at all (every default)', async () => {
    @Module({ imports: [RateLimitModule.forRoot()], controllers: [reportsController([policy({})])] })
    class DefaultsAppModule {}
    expect(await startUp(DefaultsAppModule)).toEqual({ phase: 'started' });
  });
});

describe('each error carries the stable code of its kind of mistake, and its message ends with the code and its help', () => {
  /** Compiles `module` (logs silenced) and answers the app, to init; or the error that stopped the compilation. */
  async function compiled(module: Type) {
    const moduleRef = await Test.createTestingModule({ imports: [module] })
      .setLogger({ log() {}, error() {}, warn() {} })
      .compile();
    return moduleRef.createNestApplication({ logger: false });
  }

  function expectCodeLines(error: RateLimitConfigError, code: RateLimitErrorCode): void {
    expect(error.message).toBe(
      `${error.reason}\n  [${code}] ${RATE_LIMIT_ERROR_CODES[code]}\n  See ` +
        `https://github.com/nest-redis-rate-limit/nest-redis-rate-limit/blob/main/docs/reference/errors.md#${code.toLowerCase()}`,
    );
  }

  it.each([
    [
      'an invalid policy',
      'ERR_RATE_LIMIT_INVALID_POLICY',
      policy({ capacity: 0 }),
      `@RateLimit capacity must be an integer >= 1 (got 0) ${on}`,
    ],
    [
      'an unknown key in a policy',
      'ERR_RATE_LIMIT_UNKNOWN_OPTION',
      RateLimit({ capacity: 10, refillPerSecond: 1, keyby: 'user' } as RateLimitPolicy),
      `@RateLimit unknown key "keyby" in the policy (did you mean "keyBy"?) ${on}`,
    ],
    [
      'stacked policies on one bucket',
      'ERR_RATE_LIMIT_POLICY_CONFLICT',
      [policy({ name: 'quota' }), policy({ name: 'quota' })],
      '@RateLimit policies stacked on ReportsController.list share one bucket: give each a different name or keyBy',
    ],
  ] as const)('app.init() rejects %s with %s', async (_case, code, decorators, reason) => {
    const app = await compiled(await appWith(reportsController([decorators].flat())));
    try {
      const init = app.init();
      await expect(init).rejects.toBeInstanceOf(RateLimitConfigError);
      await expect(init).rejects.toMatchObject({ code, reason, help: RATE_LIMIT_ERROR_CODES[code] });
      expectCodeLines((await init.catch((error: unknown) => error)) as RateLimitConfigError, code);
    } finally {
      await app.close();
    }
  });

  it.each([
    ['a redis URL without scheme', { redis: 'localhost:6379' }, 'ERR_RATE_LIMIT_INVALID_REDIS_OPTION'],
    ['a redis port that is not a number', { redis: { host: '127.0.0.1', port: '6380x' } }, 'ERR_RATE_LIMIT_INVALID_REDIS_OPTION'],
    ['a redis host left undefined', { redis: { host: undefined, port: 6380 } }, 'ERR_RATE_LIMIT_REDIS_OPTION_UNDEFINED'],
    ['an unknown redis key', { redis: { host: '127.0.0.1', prot: 6380 } }, 'ERR_RATE_LIMIT_UNKNOWN_OPTION'],
    ['an invalid option value', { failureMode: 'half-open' }, 'ERR_RATE_LIMIT_INVALID_OPTION'],
  ] as const)('the module rejects %s with %s while it is built', async (_case, options, code) => {
    const building = compiled(await appWith(undefined, options as Partial<RateLimitModuleOptions>));
    await expect(building).rejects.toMatchObject({ name: 'RateLimitConfigError', code });
    expectCodeLines((await building.catch((error: unknown) => error)) as RateLimitConfigError, code);
  });

  it('app.init() rejects @RateLimit in an app without the module with ERR_RATE_LIMIT_MODULE_NOT_IMPORTED', async () => {
    @Module({ controllers: [reportsController([policy({})])] })
    class NoModuleCodeAppModule {}
    const app = await compiled(NoModuleCodeAppModule);
    try {
      await expect(app.init()).rejects.toMatchObject({ code: 'ERR_RATE_LIMIT_MODULE_NOT_IMPORTED' });
    } finally {
      await app.close();
    }
  });

  it('the module imported without options is ERR_RATE_LIMIT_MODULE_WITHOUT_OPTIONS', async () => {
    @Module({ imports: [RateLimitModule] })
    class BareCodeAppModule {}
    await expect(compiled(BareCodeAppModule)).rejects.toMatchObject({ code: 'ERR_RATE_LIMIT_MODULE_WITHOUT_OPTIONS' });
  });
});
