import { type INestApplication, Logger, Module, type Provider, type Type } from '@nestjs/common';
import { APP_GUARD, ModuleRef } from '@nestjs/core';
import { Redis } from 'ioredis';
import request from 'supertest';
import { RateLimitGuard, RateLimitModule, type RateLimitModuleOptions } from 'nest-redis-rate-limit';
import { createApp, PLATFORMS, type Platform } from '../../support/app.js';
import { LogRecorder } from '../../support/log-recorder.js';
import { deleteKeys, keysUnder, redisUrl, testPrefix } from '../../support/redis.js';
import { ClientIpGuard, GuardedFeatureModule, MixedController, PlacedController } from './placement.controllers.js';

/** Where the guard is placed: by the module, by the app (`guard: false`), twice by mistake, or nowhere. */
describe.each(PLATFORMS)('placing RateLimitGuard on %s', (platform: Platform) => {
  const prefix = testPrefix(`guard-placement-${platform}`);
  const recorder = new LogRecorder();
  let client: Redis;
  let app: INestApplication | undefined;

  async function start(
    name: string,
    options: RateLimitModuleOptions,
    providers: Provider[] = [],
    imports: any[] = [],
    controllers: Type[] = [PlacedController],
  ) {
    @Module({
      imports: [RateLimitModule.forRoot({ redis: await redisUrl(), keyPrefix: `${prefix}${name}:`, ...options }), ...imports],
      controllers,
      providers,
    })
    class PlacementAppModule {}
    app = await createApp(PlacementAppModule, platform);
    Logger.overrideLogger(recorder);
    recorder.clear();
    return app;
  }
  const get = (path: string, headers: Record<string, string> = {}) => {
    const req = request(app!.getHttpServer()).get(path);
    for (const [name, value] of Object.entries(headers)) req.set(name, value);
    return req;
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

  it('uses a subclass registered as APP_GUARD (guard: false) in both phases: its getIp keys the IP and the user fallback', async () => {
    await start('subclass', { guard: false }, [{ provide: APP_GUARD, useClass: ClientIpGuard }]);
    expect((await get('/placed/ip', { 'x-client-ip': '198.51.100.1' }).expect(200)).headers['x-ratelimit-remaining']).toBe('1');
    expect((await get('/placed/ip', { 'x-client-ip': '198.51.100.2' }).expect(200)).headers['x-ratelimit-remaining']).toBe('1');
    await get('/placed/ip', { 'x-client-ip': '198.51.100.1' }).expect(200);
    await get('/placed/ip', { 'x-client-ip': '198.51.100.1' }).expect(429);
    await get('/placed/user', { 'x-client-ip': '198.51.100.7' }).expect(200);
    expect(await keysUnder(client, `${prefix}subclass:`)).toEqual([
      `${prefix}subclass:{ip:198.51.100.1}:PlacedController.ip`,
      `${prefix}subclass:{ip:198.51.100.2}:PlacedController.ip`,
      `${prefix}subclass:{ip:198.51.100.7}:PlacedController.user`,
    ]);
  });

  it('resolves @UseGuards(RateLimitGuard) in a feature module that does not import RateLimitModule', async () => {
    await start('use-guards', { guard: false }, [], [GuardedFeatureModule], []);
    expect((await get('/guarded').expect(200)).headers['x-ratelimit-remaining']).toBe('1');
    expect((await get('/guarded').expect(200)).headers['x-ratelimit-remaining']).toBe('0');
    await get('/guarded').expect(429);
    expect(await keysUnder(client, `${prefix}use-guards:`)).toEqual([`${prefix}use-guards:{ip:127.0.0.1}:GuardedController.get`]);
  });

  it('charges once when the app registers RateLimitGuard beside the module guard, and says how to fix it once', async () => {
    await start('twice', {}, [{ provide: APP_GUARD, useClass: RateLimitGuard }]);
    expect((await get('/placed/ip').expect(200)).headers['x-ratelimit-remaining']).toBe('1');
    expect((await get('/placed/ip').expect(200)).headers['x-ratelimit-remaining']).toBe('0');
    await get('/placed/ip').expect(429);
    const warnings = recorder.of('RateLimit', 'warn');
    expect(warnings).toHaveLength(1);
    expect(warnings[0]).toMatch(/^Two rate-limit guards run on PlacedController\.ip \(RateLimitGuard, then RateLimitGuard\)/);
    expect(warnings[0]).toContain('guard: false');
  });

  it('refuses to start with guard: false when no RateLimitGuard would run on a per-IP route, naming it', async () => {
    await expect(start('no-guard', { guard: false })).rejects.toThrow(
      'RateLimitModule.forRoot({ guard: false }), but no RateLimitGuard runs on PlacedController.ip: their @RateLimit ' +
        'policies would not be enforced. Register RateLimitGuard (APP_GUARD, app.useGlobalGuards() or @UseGuards()) or remove guard: false',
    );
  });

  it('starts with guard: false when the app adds RateLimitGuard with useGlobalGuards()', async () => {
    @Module({
      imports: [RateLimitModule.forRoot({ redis: await redisUrl(), keyPrefix: `${prefix}global:`, guard: false })],
      controllers: [PlacedController],
    })
    class GlobalGuardAppModule {}
    app = await createApp(GlobalGuardAppModule, platform, (nest) => nest.useGlobalGuards(new RateLimitGuard(nest.get(ModuleRef))));
    await get('/placed/ip').expect(200);
    await get('/placed/ip').expect(200);
    await get('/placed/ip').expect(429);
  });

  it('decides every policy in the interceptor when no guard runs on a route that has one, and warns once', async () => {
    await start('interceptor-only', { guard: false }, [], [], [MixedController]);
    await get('/mixed').expect(200);
    await get('/mixed').expect(200);
    const refused = await get('/mixed').expect(429);
    // The per-IP burst (2, refilled 0.001/s) refused: its next token is 1000 s away.
    expect(refused.headers['retry-after']).toBe('1000');
    const warnings = recorder.of('RateLimit', 'warn');
    expect(warnings.filter((w) => w.startsWith('No RateLimitGuard ran before MixedController.get'))).toHaveLength(1);
  });
});
