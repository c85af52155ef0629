import type { INestApplication } from '@nestjs/common';
import { Redis } from 'ioredis';
import request from 'supertest';
import type { RateLimitModuleOptions } from 'nest-redis-rate-limit';
import { createApp, PLATFORMS } from '../support/app.js';
import { deleteKeys, redisUrl, testPrefix } from '../support/redis.js';
import { headersAppModule } from './app.module.js';

const RATE_LIMIT_HEADERS = [
  'x-ratelimit-limit',
  'x-ratelimit-remaining',
  'x-ratelimit-reset',
  'ratelimit-limit',
  'ratelimit-remaining',
  'ratelimit-reset',
  'ratelimit-policy',
  'ratelimit',
];

/** Sends `n` requests one after another and returns the last response. */
async function burst(app: INestApplication, path: string, n: number) {
  let last: request.Response | undefined;
  for (let i = 0; i < n; i++) last = await request(app.getHttpServer()).get(path);
  return last!;
}

describe.each(PLATFORMS)('rate-limit headers on %s', (platform) => {
  const prefix = testPrefix(`headers-${platform}`);
  let client: Redis;
  const apps: INestApplication[] = [];

  async function start(options: RateLimitModuleOptions = {}): Promise<INestApplication> {
    const app = await createApp(
      headersAppModule({ redis: await redisUrl(), keyPrefix: `${prefix}${apps.length}:`, ...options }),
      platform,
    );
    apps.push(app);
    return app;
  }

  beforeAll(async () => {
    client = new Redis(await redisUrl());
  });

  afterAll(async () => {
    await Promise.all(apps.map((app) => app.close()));
    await deleteKeys(client, prefix);
    await client.quit();
  });

  it('sends X-RateLimit-* and the draft-6 fields by default, all integers', async () => {
    const app = await start();
    const res = await request(app.getHttpServer()).get('/limited/burst').expect(200);
    expect(res.headers['x-ratelimit-limit']).toBe('100');
    expect(res.headers['x-ratelimit-remaining']).toBe('99');
    // One token short of full at 0.01 tokens/s: 100 s until full.
    expect(res.headers['x-ratelimit-reset']).toBe('100');
    expect(res.headers['ratelimit-limit']).toBe('100');
    expect(res.headers['ratelimit-remaining']).toBe('99');
    expect(res.headers['ratelimit-reset']).toBe('100');
    expect(res.headers['ratelimit-policy']).toBe('100;w=10000');
    expect(res.headers['ratelimit']).toBeUndefined();
    expect(res.headers['retry-after']).toBeUndefined();
  });

  it('denies the 101st request of a burst of 100 with 429, Retry-After >= 1, remaining 0 and a JSON body', async () => {
    const app = await start();
    const hundredth = await burst(app, '/limited/burst', 100);
    expect(hundredth.status).toBe(200);
    expect(hundredth.headers['x-ratelimit-remaining']).toBe('0');
    const denied = await request(app.getHttpServer()).get('/limited/burst').expect(429);
    const retryAfter = Number(denied.headers['retry-after']);
    expect(denied.headers['retry-after']).toMatch(/^\d+$/);
    // The next token is at most 100 s away at 0.01 tokens/s, and at least one second.
    expect(retryAfter).toBeGreaterThanOrEqual(99);
    expect(retryAfter).toBeLessThanOrEqual(100);
    expect(denied.headers['x-ratelimit-limit']).toBe('100');
    expect(denied.headers['x-ratelimit-remaining']).toBe('0');
    expect(denied.headers['ratelimit-remaining']).toBe('0');
    expect(denied.headers['ratelimit-policy']).toBe('100;w=10000');
    expect(denied.body).toEqual({ statusCode: 429, message: 'Too Many Requests', retryAfter });
    for (const name of RATE_LIMIT_HEADERS.filter((h) => h !== 'ratelimit-policy' && h !== 'ratelimit')) {
      expect(denied.headers[name]).toMatch(/^\d+$/);
    }
  });

  it('takes `cost` tokens per request and reports the wait for the whole cost', async () => {
    const app = await start();
    const first = await request(app.getHttpServer()).get('/limited/costly').expect(200);
    expect(first.headers['x-ratelimit-remaining']).toBe('6');
    // 4 tokens short of full: 400 s.
    expect(first.headers['x-ratelimit-reset']).toBe('400');
    await request(app.getHttpServer()).get('/limited/costly').expect(200);
    const denied = await request(app.getHttpServer()).get('/limited/costly').expect(429);
    expect(denied.headers['x-ratelimit-remaining']).toBe('2');
    // 2 tokens held, 4 needed: 200 s at 0.01/s (a hair less as tokens trickle in).
    expect(Number(denied.headers['retry-after'])).toBeGreaterThanOrEqual(199);
    expect(Number(denied.headers['retry-after'])).toBeLessThanOrEqual(200);
  });

  it('sends the draft-7 combined field when asked', async () => {
    const app = await start({ standardHeaders: 'draft-7' });
    const res = await request(app.getHttpServer()).get('/limited/burst').expect(200);
    expect(res.headers['ratelimit']).toBe('limit=100, remaining=99, reset=100');
    expect(res.headers['ratelimit-policy']).toBe('100;w=10000');
    expect(res.headers['ratelimit-limit']).toBeUndefined();
    expect(res.headers['x-ratelimit-remaining']).toBe('99');
  });

  it('sends draft-8 fields named after the policy name, else Controller.handler', async () => {
    const app = await start({ standardHeaders: 'draft-8', legacyHeaders: false });
    const res = await request(app.getHttpServer()).get('/limited/burst').expect(200);
    expect(res.headers['ratelimit-policy']).toBe('"LimitedController.burst";q=100;w=10000');
    expect(res.headers['ratelimit']).toBe('"LimitedController.burst";r=99;t=100');
    expect(res.headers['x-ratelimit-limit']).toBeUndefined();
    const named = await request(app.getHttpServer()).get('/limited/costly').expect(200);
    expect(named.headers['ratelimit-policy']).toBe('"costly-reports";q=10;w=1000');
    expect(named.headers['ratelimit']).toBe('"costly-reports";r=6;t=400');
  });

  it('sends no rate-limit headers when both kinds are turned off, but still Retry-After on a 429', async () => {
    const app = await start({ standardHeaders: false, legacyHeaders: false });
    const res = await request(app.getHttpServer()).get('/limited/costly').expect(200);
    for (const name of RATE_LIMIT_HEADERS) expect(res.headers[name]).toBeUndefined();
    await request(app.getHttpServer()).get('/limited/costly').expect(200);
    const denied = await request(app.getHttpServer()).get('/limited/costly').expect(429);
    for (const name of RATE_LIMIT_HEADERS) expect(denied.headers[name]).toBeUndefined();
    expect(Number(denied.headers['retry-after'])).toBeGreaterThanOrEqual(199);
  });
});
