import { createHash, createHmac } from 'node:crypto';
import { performance } from 'node:perf_hooks';
import { type INestApplication, Module } from '@nestjs/common';
import { Redis } from 'ioredis';
import request from 'supertest';
import { RateLimitModule, type RateLimitModuleOptions } from 'nest-redis-rate-limit';
import { createApp, PLATFORMS, type Platform } from '../../support/app.js';
import { deleteKeys, keysUnder, redisUrl, testPrefix, tokensOf } from '../../support/redis.js';
import { ApiKeysController } from './api-keys.controller.js';

/** The accounts behind the keys this app issued; anything else is made up. */
const ACCOUNTS = new Map([
  ['sk_live_alpha', 'acct-1'],
  ['sk_live_beta', 'acct-2'],
]);
const SECRET = 'a-test-secret-of-32-characters!!';
const sha = (value: string) => createHash('sha256').update(value).digest('hex').slice(0, 32);
const hmac = (value: string) => createHmac('sha256', SECRET).update(value).digest('hex').slice(0, 32);

/** Looks the key up as a database would (asynchronously); undefined for a key nobody issued. */
async function verifiedAccount(req: { headers: Record<string, string | undefined> }): Promise<string | undefined> {
  await new Promise((resolve) => setImmediate(resolve));
  const key = req.headers['x-api-key'];
  return key === undefined ? undefined : ACCOUNTS.get(key);
}

describe.each(PLATFORMS)('API keys on %s', (platform: Platform) => {
  const prefix = testPrefix(`api-keys-${platform}`);
  let client: Redis;
  const apps: INestApplication[] = [];

  async function start(name: string, options: RateLimitModuleOptions): Promise<INestApplication> {
    @Module({
      imports: [RateLimitModule.forRoot({ redis: await redisUrl(), keyPrefix: `${prefix}${name}:`, ...options })],
      controllers: [ApiKeysController],
    })
    class ApiKeysAppModule {}
    const app = await createApp(ApiKeysAppModule, platform);
    apps.push(app);
    return app;
  }
  const get = (app: INestApplication, path: string, key?: string) => {
    const req = request(app.getHttpServer()).get(path);
    return key === undefined ? req : req.set('x-api-key', key);
  };
  const statuses = async (app: INestApplication, path: string, keys: string[]) => {
    const counts: Record<number, number> = {};
    for (const key of keys) {
      const { status } = await get(app, path, key);
      counts[status] = (counts[status] ?? 0) + 1;
    }
    return counts;
  };
  const madeUp = (n: number) => Array.from({ length: n }, (_, i) => `made-up-${i}`);

  beforeAll(async () => {
    client = new Redis(await redisUrl());
  });
  afterAll(async () => {
    for (const app of apps) await app.close();
    await deleteKeys(client, prefix);
    await client.quit();
  });

  describe('verified by keys.apiKey, digested with keys.secret', () => {
    let app: INestApplication;
    beforeAll(async () => {
      app = await start('verified', { keys: { apiKey: verifiedAccount, secret: SECRET } });
    });

    it('sends 100 made-up keys from one IP to one IP bucket: 2 allowed, 98 refused, one key in Redis', async () => {
      expect(await statuses(app, '/keys/only-key', madeUp(100))).toEqual({ 200: 2, 429: 98 });
      expect(await keysUnder(client, `${prefix}verified:`)).toEqual([`${prefix}verified:{ip:127.0.0.1}:ApiKeysController.onlyKey`]);
    });

    it('gives each verified account its own bucket, named by an HMAC of what the hook returned', async () => {
      expect((await get(app, '/keys/only-key', 'sk_live_alpha').expect(200)).headers['x-ratelimit-remaining']).toBe('1');
      expect((await get(app, '/keys/only-key', 'sk_live_beta').expect(200)).headers['x-ratelimit-remaining']).toBe('1');
      await get(app, '/keys/only-key', 'sk_live_alpha').expect(200);
      await get(app, '/keys/only-key', 'sk_live_alpha').expect(429);
      const keys = await keysUnder(client, `${prefix}verified:`);
      expect(keys).toContain(`${prefix}verified:{key:${hmac('acct-1')}}:ApiKeysController.onlyKey`);
      expect(keys).toContain(`${prefix}verified:{key:${hmac('acct-2')}}:ApiKeysController.onlyKey`);
      expect(keys.join('\n')).not.toContain(sha('acct-1'));
      expect(keys.join('\n')).not.toContain('sk_live');
    });
  });

  describe('looked up by a hook that never answers', () => {
    let app: INestApplication;
    beforeAll(async () => {
      app = await start('hung', { timeoutMs: 100, keys: { apiKey: () => new Promise<string>(() => undefined) } });
    });

    it('answers within timeoutMs + 400 ms from the IP bucket instead of hanging the request', async () => {
      const started = performance.now();
      expect((await get(app, '/keys/only-key', 'sk_live_alpha').expect(200)).headers['x-ratelimit-remaining']).toBe('1');
      expect(performance.now() - started).toBeLessThan(500);
      await get(app, '/keys/only-key', 'sk_live_beta').expect(200);
      await get(app, '/keys/only-key', 'sk_live_alpha').expect(429);
      expect(await keysUnder(client, `${prefix}hung:`)).toEqual([`${prefix}hung:{ip:127.0.0.1}:ApiKeysController.onlyKey`]);
    });
  });

  describe('read from the raw header (no keys.apiKey)', () => {
    let app: INestApplication;
    beforeAll(async () => {
      app = await start('raw', {});
    });

    it('lets made-up keys through a route limited only by API key: one new bucket per key', async () => {
      expect(await statuses(app, '/keys/only-key', madeUp(20))).toEqual({ 200: 20 });
      expect(await keysUnder(client, `${prefix}raw:{key:`)).toHaveLength(20);
    });

    it('holds made-up keys rotated from one IP to the stacked per-IP budget: 5 of 30 allowed', async () => {
      expect(
        await statuses(
          app,
          '/keys/stacked',
          madeUp(30).map((key) => `${key}-stacked`),
        ),
      ).toEqual({ 200: 5, 429: 25 });
      const ipTokens = await tokensOf(client, `${prefix}raw:{ip:127.0.0.1}:ip-budget`);
      expect(ipTokens).toBeLessThan(0.1);
    });
  });
});
