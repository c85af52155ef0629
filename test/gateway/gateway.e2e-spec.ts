import { createHash } from 'node:crypto';
import type { INestApplication } from '@nestjs/common';
import { Redis } from 'ioredis';
import request from 'supertest';
import { AppModule } from '../../apps/gateway/src/app.module.js';
import { createApp, PLATFORMS } from '../support/app.js';
import { deleteKeys, freePort, keysUnder, redisUrl, testPrefix, tokensOf } from '../support/redis.js';

const sha = (value: string) => createHash('sha256').update(value).digest('hex').slice(0, 32);

describe.each(PLATFORMS)('demo gateway on %s', (platform) => {
  const prefix = testPrefix(`gateway-${platform}`);
  let client: Redis;
  let app: INestApplication;
  const http = () => request(app.getHttpServer());

  beforeAll(async () => {
    process.env.REDIS_URL = await redisUrl();
    process.env.RATE_LIMIT_PREFIX = prefix;
    process.env.API_KEYS = 'demo-key-1,demo-key-2,reporter';
    client = new Redis(await redisUrl());
    app = await createApp(AppModule, platform);
  });

  afterAll(async () => {
    await app.close();
    delete process.env.RATE_LIMIT_PREFIX;
    delete process.env.API_KEYS;
    await deleteKeys(client, prefix);
    await client.quit();
  });

  it('GET /api/hello allows a burst of 100 per verified API key (plus 20/s) and answers the rest with 429', async () => {
    const started = Date.now();
    const responses = await Promise.all(
      Array.from({ length: 160 }, () => http().get('/api/hello').set('x-api-key', 'demo-key-1')),
    );
    const seconds = (Date.now() - started) / 1000;
    const allowed = responses.filter((r) => r.status === 200).length;
    expect(allowed).toBeGreaterThanOrEqual(100);
    expect(allowed).toBeLessThanOrEqual(100 + Math.ceil(20 * seconds) + 1);
    const denied = responses.find((r) => r.status === 429)!;
    // 20 tokens per second: the next one is at most a second away.
    expect(denied.headers['retry-after']).toBe('1');
    expect(denied.headers['x-ratelimit-limit']).toBe('100');
    expect(denied.headers['x-ratelimit-remaining']).toBe('0');
    const other = await http().get('/api/hello').set('x-api-key', 'demo-key-2').expect(200);
    expect(other.body).toEqual({ message: 'Hello' });
    const otherTokens = await tokensOf(client, `${prefix}{key:${sha('demo-key-2')}}:HelloController.hello#0`);
    expect(otherTokens).toBeGreaterThanOrEqual(99);
    expect(otherTokens).toBeLessThanOrEqual(100);
    // The per-IP budget (150) has paid for both keys: now it is the most restrictive policy.
    expect(other.headers['x-ratelimit-limit']).toBe('150');
    expect(Number(other.headers['x-ratelimit-remaining'])).toBeLessThan(99);
  });

  it('GET /api/report sends made-up API keys to their IP bucket: 5 reports of 30 rotated keys, no key bucket', async () => {
    const statuses = [];
    for (let i = 0; i < 30; i++) statuses.push((await http().get('/api/report').set('x-api-key', `made-up-${i}`)).status);
    expect(statuses.filter((status) => status === 200)).toHaveLength(5);
    expect(statuses.slice(5).every((status) => status === 429)).toBe(true);
    const keys = await keysUnder(client, prefix);
    expect(keys).toContain(`${prefix}{ip:127.0.0.1}:reports`);
    expect(keys.filter((key) => key.endsWith(':reports'))).toEqual([`${prefix}{ip:127.0.0.1}:reports`]);
  });

  it('POST /auth/login allows 5 attempts per IP, then one every 12 s', async () => {
    for (let i = 0; i < 5; i++) await http().post('/auth/login').send({ username: 'ann' }).expect(200);
    const denied = await http().post('/auth/login').send({ username: 'ann' }).expect(429);
    expect(Number(denied.headers['retry-after'])).toBeGreaterThanOrEqual(11);
    expect(Number(denied.headers['retry-after'])).toBeLessThanOrEqual(12);
    expect(denied.headers['ratelimit-policy']).toBe('5;w=60');
  });

  it('GET /api/report costs 10 of 50 tokens', async () => {
    const first = await http().get('/api/report').set('x-api-key', 'reporter').expect(200);
    expect(first.headers['x-ratelimit-remaining']).toBe('40');
    for (let i = 0; i < 4; i++) await http().get('/api/report').set('x-api-key', 'reporter').expect(200);
    const denied = await http().get('/api/report').set('x-api-key', 'reporter').expect(429);
    expect(Number(denied.headers['retry-after'])).toBeGreaterThanOrEqual(9);
    expect(Number(denied.headers['retry-after'])).toBeLessThanOrEqual(10);
    expect(await keysUnder(client, prefix)).toContain(`${prefix}{key:${sha('reporter')}}:reports`);
  });

  it('GET /health is never limited and carries no rate-limit headers', async () => {
    for (let i = 0; i < 30; i++) {
      const res = await http().get('/health').expect(200);
      expect(res.headers['x-ratelimit-limit']).toBeUndefined();
    }
  });

  it('meters account exports through BucketService: 3, then a refusal with the wait', async () => {
    expect((await http().get('/accounts/7/exports').expect(200)).body).toMatchObject({ allowed: true, remaining: 3 });
    for (let i = 0; i < 3; i++) expect((await http().post('/accounts/7/exports').expect(201)).body.started).toBe(true);
    const refused = (await http().post('/accounts/7/exports').expect(201)).body;
    expect(refused.started).toBe(false);
    expect(refused.retryAfterSeconds).toBeGreaterThan(590);
  });
});

describe.each(PLATFORMS)('demo gateway without Redis on %s', (platform) => {
  let app: INestApplication;

  beforeAll(async () => {
    process.env.REDIS_URL = `redis://127.0.0.1:${await freePort()}`;
    app = await createApp(AppModule, platform);
  });

  afterAll(async () => {
    await app.close();
    delete process.env.REDIS_URL;
    delete process.env.REDIS_URL_RESOLVED;
  });

  it('starts on the in-process store and still limits', async () => {
    for (let i = 0; i < 5; i++) await request(app.getHttpServer()).post('/auth/login').expect(200);
    await request(app.getHttpServer()).post('/auth/login').expect(429);
  });
});
