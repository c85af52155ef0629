import { type INestApplication, Module, VersioningType } from '@nestjs/common';
import { RouterModule } from '@nestjs/core';
import { Redis } from 'ioredis';
import request from 'supertest';
import { BucketService, RateLimitModule } from 'nest-redis-rate-limit';
import { createApp, PLATFORMS } from '../../support/app.js';
import { deleteKeys, keysUnder, redisUrl, testPrefix } from '../../support/redis.js';
import { HealthController, itemsController, jobsController, moduleNamed, ordersController, usersController } from './scopes.controllers.js';

/**
 * An unnamed policy's bucket scope is `Controller.handler` while the class name is the app's only one of
 * that name; two different classes of one name get what tells their routes apart added (module and
 * controller path, version), so they never share a bucket; one class registered in two modules is one
 * handler; a clash nothing resolves stops start-up.
 */
describe.each(PLATFORMS)('scopes of same-named classes on %s', (platform) => {
  const prefix = testPrefix(`scopes-${platform}`);
  let client: Redis;
  let app: INestApplication;

  beforeAll(async () => {
    client = new Redis(await redisUrl());
    const usersA = usersController('a');
    const usersB = usersController('b');
    // Class A is registered in two modules, mounted at /v1 and /legacy: one handler, two paths.
    const V1 = moduleNamed('UsersV1Module', [usersA]);
    const Legacy = moduleNamed('UsersLegacyModule', [usersA]);
    const V2 = moduleNamed('UsersV2Module', [usersB]);
    const Items = moduleNamed('ItemsModule', [itemsController('1'), itemsController('2')]);
    const Orders = moduleNamed('OrdersModule', [ordersController('shop/orders'), ordersController('admin/orders')]);
    @Module({
      imports: [
        RateLimitModule.forRoot({ redis: await redisUrl(), keyPrefix: prefix, standardHeaders: 'draft-8' }),
        V1,
        V2,
        Legacy,
        Items,
        Orders,
        RouterModule.register([
          { path: 'v1', module: V1 },
          { path: 'v2', module: V2 },
          { path: 'legacy', module: Legacy },
        ]),
      ],
      controllers: [HealthController],
    })
    class ScopesAppModule {}
    app = await createApp(ScopesAppModule, platform, (created) => created.enableVersioning({ type: VersioningType.URI }));
  });

  afterAll(async () => {
    await app?.close();
    await deleteKeys(client, prefix);
    await client.quit();
  });

  const get = (path: string) => request(app.getHttpServer()).get(path);
  const scopesInRedis = async () =>
    (await keysUnder(client, `${prefix}{ip:127.0.0.1}:`)).map((key) => key.slice(`${prefix}{ip:127.0.0.1}:`.length));

  it('gives /v2/users a full bucket after /v1/users is drained (RouterModule paths), and names its scope in draft-8', async () => {
    expect((await get('/v1/users').expect(200)).body).toEqual({ tag: 'a' });
    await get('/v1/users').expect(200);
    await get('/v1/users').expect(429);
    const v2 = await get('/v2/users').expect(200);
    expect(v2.body).toEqual({ tag: 'b' });
    expect(v2.headers['x-ratelimit-remaining']).toBe('1');
    expect(v2.headers['ratelimit-policy']).toBe('"UsersController.list@/v2/users";q=2;w=2000');
    expect(v2.headers['ratelimit']).toBe('"UsersController.list@/v2/users";r=1;t=1000');
  });

  it('treats one class registered in two modules as one handler: /legacy/users shares the /v1/users bucket', async () => {
    const legacy = await get('/legacy/users').expect(429);
    expect(legacy.headers['ratelimit-policy']).toBe('"UsersController.list@/legacy/users,/v1/users";q=2;w=2000');
    const scopes = await scopesInRedis();
    expect(scopes.filter((scope) => scope.startsWith('UsersController'))).toEqual([
      'UsersController.list@/legacy/users,/v1/users',
      'UsersController.list@/v2/users',
    ]);
  });

  it('keeps URI-versioned ItemsController v1 and v2 apart', async () => {
    await get('/v1/items').expect(200);
    await get('/v1/items').expect(200);
    await get('/v1/items').expect(429);
    expect((await get('/v2/items').expect(200)).headers['x-ratelimit-remaining']).toBe('1');
    expect((await scopesInRedis()).filter((scope) => scope.startsWith('ItemsController'))).toEqual([
      'ItemsController.list@/items;v=1',
      'ItemsController.list@/items;v=2',
    ]);
  });

  it('keeps OrdersControllers at different paths apart, stacked unnamed policies numbered after the new scope', async () => {
    await get('/shop/orders').expect(200);
    await get('/shop/orders').expect(200);
    await get('/shop/orders').expect(429);
    expect((await get('/admin/orders').expect(200)).headers['x-ratelimit-remaining']).toBe('1');
    expect((await scopesInRedis()).filter((scope) => scope.startsWith('OrdersController'))).toEqual([
      'OrdersController.list@/admin/orders#0',
      'OrdersController.list@/admin/orders#1',
      'OrdersController.list@/shop/orders#0',
      'OrdersController.list@/shop/orders#1',
    ]);
  });

  it('keeps Controller.handler, and so its keys, for a class name nothing else has', async () => {
    await get('/health').expect(200);
    expect((await scopesInRedis()).filter((scope) => scope.startsWith('HealthController'))).toEqual(['HealthController.ping']);
  });

  it('peeks and resets a bucket by its new scope; the bare Controller.handler of a clash is no scope', async () => {
    const buckets = app.get(BucketService);
    const v2 = await buckets.peekRoute('UsersController.list@/v2/users', { ip: '127.0.0.1' });
    expect(v2).toMatchObject({ allowed: true, limit: 2, remaining: 1 });
    const v1 = await buckets.peekRoute('UsersController.list@/legacy/users,/v1/users', { ip: '127.0.0.1' });
    expect(v1).toMatchObject({ allowed: false, limit: 2, remaining: 0 });
    await buckets.resetRoute('UsersController.list@/legacy/users,/v1/users', { ip: '127.0.0.1' });
    expect((await get('/v1/users').expect(200)).headers['x-ratelimit-remaining']).toBe('1');
    await expect(buckets.peekRoute('UsersController.list', { ip: '127.0.0.1' })).rejects.toThrow(
      /no route policy has the scope "UsersController.list" .*UsersController\.list@\/v2\/users/,
    );
  });
});

describe('a clash of same-named classes nothing tells apart', () => {
  it('stops start-up naming both classes and their modules, and asks for a name', async () => {
    const first = moduleNamed('BillingJobsModule', [jobsController('billing.run')]);
    const second = moduleNamed('MailJobsModule', [jobsController('mail.run')]);
    @Module({
      imports: [RateLimitModule.forRoot({ redis: await redisUrl(), keyPrefix: testPrefix('scopes-clash') }), first, second],
    })
    class ClashAppModule {}
    let started: INestApplication | undefined;
    let failure: unknown;
    try {
      started = await createApp(ClashAppModule, 'express');
    } catch (error) {
      failure = error;
    } finally {
      await started?.close();
    }
    expect(String(failure)).toContain(
      'Two classes named JobsController (in BillingJobsModule and in MailJobsModule) have the same unnamed rate-limit ' +
        'scope "JobsController.handle@/"',
    );
    expect(String(failure)).toMatch(/@RateLimit\(\{ \.\.\., name: '.+' \}\)/);
  });
});
