import type { INestApplication } from '@nestjs/common';
import request from 'supertest';
import type { RateLimitModuleOptions } from 'nest-redis-rate-limit';
import { createApp, PLATFORMS } from '../../support/app.js';
import { type Answer, timedGet } from '../../support/load.js';
import { redisNow, redisUrl } from '../../support/redis.js';
import { redisScenario } from '../../support/scenario.js';
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

/**
 * Sends `n` requests one after another and returns the last response: over fetch's kept-alive
 * connection to the app listening once (supertest on the bare server opens a server per request, which
 * made a burst of 100 take over 3 s on a loaded machine).
 */
async function burst(app: INestApplication, path: string, n: number) {
  if (!app.getHttpServer().listening) await app.listen(0, '127.0.0.1');
  const url = `${(await app.getUrl()).replace('[::1]', '127.0.0.1')}${path}`;
  let last: Answer | undefined;
  for (let i = 0; i < n; i++) last = await timedGet(url);
  return last!;
}

describe.each(PLATFORMS)('rate-limit headers on %s', (platform) => {
  const scenario = redisScenario(`headers-${platform}`);

  async function start(options: RateLimitModuleOptions = {}): Promise<INestApplication> {
    const app = await createApp(headersAppModule({ redis: await redisUrl(), keyPrefix: scenario.nextKeyPrefix(), ...options }), platform);
    scenario.track(app);
    return app;
  }

  /**
   * A denial's Retry-After counts down one per second of refill: a bucket `wait` seconds of refill short
   * of the cost when the scenario's first request took its tokens answers ceil(wait - T), T the seconds
   * of Redis time since then (a floor would give one less). `requests` starts a fresh app, sends its
   * requests and answers the denial; two reads of Redis's clock around it bound T. Within 1 s (the usual
   * case) the bounds pin the value to exactly `wait`; a slower run is held to ceil(wait - T) at the least.
   */
  async function expectRetryAfter(wait: number, requests: () => Promise<request.Response>): Promise<request.Response> {
    const before = await redisNow(scenario.client);
    const denied = await requests();
    const spanMs = (await redisNow(scenario.client)) - before;
    expect(denied.status).toBe(429);
    expect(denied.headers['retry-after']).toMatch(/^\d+$/);
    const retryAfter = Number(denied.headers['retry-after']);
    expect(retryAfter).toBeLessThanOrEqual(wait);
    expect({ retryAfter, spanMs }).toEqual({ retryAfter: Math.max(retryAfter, Math.ceil(wait - spanMs / 1000)), spanMs });
    expect(denied.body.retryAfter ?? retryAfter).toBe(retryAfter);
    return denied;
  }

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

  it('denies the 101st request of a burst of 100 with 429, Retry-After 100 (the ceiling), remaining 0 and a JSON body', async () => {
    // The next token is 100 s away at 0.01 tokens/s, less the refill since the burst began: 100 (ceil).
    const denied = await expectRetryAfter(100, async () => {
      const app = await start();
      const hundredth = await burst(app, '/limited/burst', 100);
      expect(hundredth.status).toBe(200);
      expect(hundredth.remaining).toBe('0');
      return request(app.getHttpServer()).get('/limited/burst');
    });
    const retryAfter = Number(denied.headers['retry-after']);
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
    // 2 tokens held, 4 needed: 200 s at 0.01/s, less the refill since the first request: 200 (ceil).
    const denied = await expectRetryAfter(200, async () => {
      const app = await start();
      const first = await request(app.getHttpServer()).get('/limited/costly').expect(200);
      expect(first.headers['x-ratelimit-remaining']).toBe('6');
      // 4 tokens short of full, at the moment they were taken: 400 s.
      expect(first.headers['x-ratelimit-reset']).toBe('400');
      await request(app.getHttpServer()).get('/limited/costly').expect(200);
      return request(app.getHttpServer()).get('/limited/costly');
    });
    expect(denied.headers['x-ratelimit-remaining']).toBe('2');
    // 8 tokens short of full: 800 s, less the same refill.
    expect(denied.headers['x-ratelimit-reset']).toBe('800');
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
    const denied = await expectRetryAfter(200, async () => {
      const app = await start({ standardHeaders: false, legacyHeaders: false });
      const res = await request(app.getHttpServer()).get('/limited/costly').expect(200);
      for (const name of RATE_LIMIT_HEADERS) expect(res.headers[name]).toBeUndefined();
      await request(app.getHttpServer()).get('/limited/costly').expect(200);
      return request(app.getHttpServer()).get('/limited/costly');
    });
    for (const name of RATE_LIMIT_HEADERS) expect(denied.headers[name]).toBeUndefined();
  });
});
