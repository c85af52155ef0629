import { createHash } from 'node:crypto';
import { type INestApplication, Module } from '@nestjs/common';
import { Redis } from 'ioredis';
import request from 'supertest';
import { RateLimitModule } from 'nest-redis-rate-limit';
import { createApp, PLATFORMS } from '../../support/app.js';
import { deleteKeys, keysUnder, redisUrl, testPrefix } from '../../support/redis.js';
import { KeyByController } from './key-by.controller.js';

const sha = (value: string) => createHash('sha256').update(value).digest('hex').slice(0, 32);

describe.each(PLATFORMS)('keyBy on %s', (platform) => {
  const prefix = testPrefix(`key-by-${platform}`);
  let client: Redis;
  let app: INestApplication;
  const get = (path: string, headers: Record<string, string> = {}) => {
    const req = request(app.getHttpServer()).get(path);
    for (const [name, value] of Object.entries(headers)) req.set(name, value);
    return req;
  };

  beforeAll(async () => {
    client = new Redis(await redisUrl());
    @Module({
      imports: [
        RateLimitModule.forRoot({
          redis: await redisUrl(),
          keyPrefix: prefix,
          keys: { user: (req) => req.headers['x-user'] },
        }),
      ],
      controllers: [KeyByController],
    })
    class KeyByAppModule {}
    app = await createApp(KeyByAppModule, platform);
  });

  afterAll(async () => {
    await app.close();
    await deleteKeys(client, prefix);
    await client.quit();
  });

  it('gives each API key its own bucket, stored only as a digest of the key', async () => {
    await get('/by/api-key', { 'x-api-key': 'secret-alpha' }).expect(200);
    await get('/by/api-key', { 'x-api-key': 'secret-alpha' }).expect(200);
    await get('/by/api-key', { 'x-api-key': 'secret-alpha' }).expect(429);
    const other = await get('/by/api-key', { 'x-api-key': 'secret-beta' }).expect(200);
    expect(other.headers['x-ratelimit-remaining']).toBe('1');
    const keys = await keysUnder(client, prefix);
    expect(keys).toContain(`${prefix}{key:${sha('secret-alpha')}}:KeyByController.apiKey`);
    expect(keys).toContain(`${prefix}{key:${sha('secret-beta')}}:KeyByController.apiKey`);
    expect(keys.join('\n')).not.toContain('secret-');
  });

  it('falls back to the IP bucket when a request has no API key', async () => {
    await get('/by/api-key').expect(200);
    const keys = await keysUnder(client, prefix);
    expect(keys).toContain(`${prefix}{ip:127.0.0.1}:KeyByController.apiKey`);
  });

  it('gives each user a bucket of their own, and users without an id the IP bucket', async () => {
    await get('/by/user', { 'x-user': 'alice' }).expect(200);
    await get('/by/user', { 'x-user': 'alice' }).expect(200);
    await get('/by/user', { 'x-user': 'alice' }).expect(429);
    await get('/by/user', { 'x-user': 'bob' }).expect(200);
    await get('/by/user').expect(200);
    const keys = await keysUnder(client, prefix);
    expect(keys).toContain(`${prefix}{user:alice}:KeyByController.user`);
    expect(keys).toContain(`${prefix}{user:bob}:KeyByController.user`);
    expect(keys).toContain(`${prefix}{ip:127.0.0.1}:KeyByController.user`);
  });

  it('keys by the client IP (written 127.0.0.1, never ::ffff:127.0.0.1), whatever API key is sent', async () => {
    await get('/by/ip').expect(200);
    const last = await get('/by/ip').expect(200);
    expect(last.headers['x-ratelimit-remaining']).toBe('0');
    await get('/by/ip', { 'x-api-key': 'does-not-matter' }).expect(429);
    expect(await keysUnder(client, `${prefix}{ip:127.0.0.1}:KeyByController.ip`)).toHaveLength(1);
  });

  it('keys by what a keyBy function returns, one bucket per value', async () => {
    await get('/by/tenant', { 'x-tenant': 'acme' }).expect(200);
    await get('/by/tenant', { 'x-tenant': 'acme' }).expect(200);
    await get('/by/tenant', { 'x-tenant': 'acme' }).expect(429);
    await get('/by/tenant', { 'x-tenant': 'globex' }).expect(200);
    const keys = await keysUnder(client, prefix);
    expect(keys).toContain(`${prefix}{id:acme}:KeyByController.tenant`);
    expect(keys).toContain(`${prefix}{id:globex}:KeyByController.tenant`);
  });

  it('shares one bucket between routes whose policies have the same name', async () => {
    const headers = { 'x-api-key': 'shared-key' };
    expect((await get('/by/shared-a', headers).expect(200)).headers['x-ratelimit-remaining']).toBe('2');
    expect((await get('/by/shared-b', headers).expect(200)).headers['x-ratelimit-remaining']).toBe('1');
    await get('/by/shared-a', headers).expect(200);
    await get('/by/shared-b', headers).expect(429);
    expect(await keysUnder(client, `${prefix}{key:${sha('shared-key')}}:`)).toEqual([`${prefix}{key:${sha('shared-key')}}:shared`]);
  });

  it('writes every key as {prefix}{identity}:scope with the identity as the Cluster hash tag', async () => {
    const keys = await keysUnder(client, prefix);
    expect(keys.length).toBeGreaterThanOrEqual(8);
    for (const key of keys) {
      expect(key.slice(prefix.length)).toMatch(/^\{(ip|user|key|id):[A-Za-z0-9._:@-]+\}:[A-Za-z0-9._:@#-]+$/);
    }
  });
});
