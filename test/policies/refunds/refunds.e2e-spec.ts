import { type INestApplication, Logger } from '@nestjs/common';
import request from 'supertest';
import { BucketService, RateLimitUnavailableError, type RateLimitModuleOptions } from 'nest-redis-rate-limit';
import { createApp, PLATFORMS } from '../../support/app.js';
import { LogRecorder } from '../../support/log-recorder.js';
import { redisUrl, tokensOf } from '../../support/redis.js';
import { redisScenario } from '../../support/scenario.js';
import { refundsAppModule } from './refunds.controllers.js';

/** Refunds by outcome (`refundOn`) and `BucketService.refund` (issue 12, item 2). */
describe.each(PLATFORMS)('refunds by outcome on %s', (platform) => {
  const scenario = redisScenario(`refunds-${platform}`, { restoreLogger: true });
  const logs = new LogRecorder();

  async function start(options: RateLimitModuleOptions = {}): Promise<{ app: INestApplication; url: string; keyPrefix: string }> {
    const keyPrefix = scenario.nextKeyPrefix();
    const app = await createApp(refundsAppModule({ redis: await redisUrl(), keyPrefix, ...options }), platform);
    scenario.track(app);
    Logger.overrideLogger(logs);
    await app.listen(0, '127.0.0.1');
    return { app, url: await app.getUrl(), keyPrefix };
  }

  const key = (keyPrefix: string, scope: string, id = 'ip:127.0.0.1') => `${keyPrefix}{${id}}:${scope}`;

  it('counts only failed logins: 10 successes cost nothing, then 3 failures empty the bucket', async () => {
    const { url, keyPrefix } = await start();
    const bucket = key(keyPrefix, 'RefundsController.login');
    for (let i = 0; i < 10; i++) {
      const ok = await request(url).post('/refunds/login').send({ password: 'right' }).expect(201);
      // The headers are written again after the refund: the token is back.
      expect(ok.headers['ratelimit-remaining']).toBe('3');
    }
    expect(await tokensOf(scenario.client, bucket)).toBe(3);
    for (const remaining of ['2', '1', '0']) {
      const failed = await request(url).post('/refunds/login').send({ password: 'wrong' }).expect(401);
      expect(failed.headers['ratelimit-remaining']).toBe(remaining);
    }
    await request(url).post('/refunds/login').send({ password: 'wrong' }).expect(429);
    // The bucket is empty: even the right password waits.
    const denied = await request(url).post('/refunds/login').send({ password: 'right' }).expect(429);
    expect(denied.headers['retry-after']).toBe('1000');
  });

  it('lets exactly 3 of 20 parallel failed logins through, and refunds none of them', async () => {
    const { url, keyPrefix } = await start();
    const responses = await Promise.all(Array.from({ length: 20 }, () => request(url).post('/refunds/login').send({ password: 'wrong' })));
    const statuses = responses.map((r) => r.status).sort();
    expect(statuses.filter((s) => s === 401)).toHaveLength(3);
    expect(statuses.filter((s) => s === 429)).toHaveLength(17);
    const tokens = await tokensOf(scenario.client, key(keyPrefix, 'RefundsController.login'));
    expect(tokens).toBeGreaterThanOrEqual(0);
    expect(tokens).toBeLessThan(0.05);
  });

  it("gives failures back with refundOn 'failure', with the refunded numbers on the error response", async () => {
    const { url, keyPrefix } = await start();
    for (let i = 0; i < 5; i++) {
      const failed = await request(url).get('/refunds/upstream/fail').expect(502);
      expect(failed.headers['ratelimit-remaining']).toBe('2');
    }
    expect(await tokensOf(scenario.client, key(keyPrefix, 'RefundsController.upstream'))).toBe(2);
    await request(url).get('/refunds/upstream/ok').expect(200);
    await request(url).get('/refunds/upstream/ok').expect(200);
    await request(url).get('/refunds/upstream/ok').expect(429);
  });

  it('refunds exactly the cost into a partly drained bucket: capacity 5, 3 taken, a failure given back, Remaining 1 after the next', async () => {
    // The other refund tests give tokens back into a full bucket, where the cap hides a token too many.
    const { url, keyPrefix } = await start();
    const bucket = key(keyPrefix, 'RefundsController.partial');
    for (const remaining of ['4', '3', '2']) {
      expect((await request(url).get('/refunds/partial/ok').expect(200)).headers['x-ratelimit-remaining']).toBe(remaining);
    }
    // Takes 1 of 2, gives back 1: 2 again, not 3.
    const failed = await request(url).get('/refunds/partial/fail').expect(502);
    expect(failed.headers['x-ratelimit-remaining']).toBe('2');
    expect(failed.headers['ratelimit-remaining']).toBe('2');
    // 2 tokens plus what 0.001/s refilled since the first request (well under 0.05 in any run that passes its timeout).
    const tokens = await tokensOf(scenario.client, bucket);
    expect(tokens).toBeGreaterThanOrEqual(2);
    expect(tokens).toBeLessThan(2.05);
    expect((await request(url).get('/refunds/partial/ok').expect(200)).headers['x-ratelimit-remaining']).toBe('1');
    expect((await request(url).get('/refunds/partial/ok').expect(200)).headers['x-ratelimit-remaining']).toBe('0');
    const denied = await request(url).get('/refunds/partial/ok').expect(429);
    expect(denied.headers['x-ratelimit-remaining']).toBe('0');
  });

  it('asks a refundOn function with the status: only 404s are given back', async () => {
    const { url, keyPrefix } = await start();
    for (let i = 0; i < 4; i++) await request(url).get('/refunds/lookup/missing').expect(404);
    expect(await tokensOf(scenario.client, key(keyPrefix, 'RefundsController.lookup'))).toBe(2);
    await request(url).get('/refunds/lookup/a').expect(200);
    await request(url).get('/refunds/lookup/b').expect(200);
    await request(url).get('/refunds/lookup/missing').expect(429);
  });

  it('refunds nothing when refundOn throws, and logs it', async () => {
    const { url } = await start();
    logs.clear();
    await request(url).get('/refunds/broken').expect(200);
    await request(url).get('/refunds/broken').expect(200);
    await request(url).get('/refunds/broken').expect(429);
    expect(logs.of('RateLimit', 'warn').some((m) => m.includes('refundOn of RefundsController.broken') && m.includes('refundOn bug'))).toBe(
      true,
    );
  });

  it('refunds the buckets of both phases on success, and neither on failure', async () => {
    const { url, keyPrefix } = await start();
    const ip = key(keyPrefix, 'both-ip');
    const user = key(keyPrefix, 'both-user', 'user:zoe');
    for (let i = 0; i < 3; i++) await request(url).get('/refunds/both').set('x-user', 'zoe').expect(200);
    expect(await tokensOf(scenario.client, ip)).toBe(4);
    expect(await tokensOf(scenario.client, user)).toBe(2);
    await request(url).get('/refunds/both?fail=1').set('x-user', 'zoe').expect(400);
    expect(await tokensOf(scenario.client, ip)).toBeCloseTo(3, 2);
    expect(await tokensOf(scenario.client, user)).toBeCloseTo(1, 2);
    // A success now refunds into buckets below capacity (3 of 4, 1 of 2): each phase gets exactly its cost
    // back (within 0.05: 50 s of refill at 0.001/s; a token too many is 1).
    const ok = await request(url).get('/refunds/both').set('x-user', 'zoe').expect(200);
    expect(await tokensOf(scenario.client, ip)).toBeCloseTo(3, 1);
    expect(await tokensOf(scenario.client, user)).toBeCloseTo(1, 1);
    // The headers describe the most restrictive bucket after the refund: the user's, 1 left.
    expect(ok.headers['x-ratelimit-remaining']).toBe('1');
  });

  it('BucketService.refund gives tokens back, capped at capacity, and answers the bucket after it', async () => {
    const { app } = await start();
    const buckets = app.get(BucketService);
    const policy = { capacity: 5, refillPerSecond: 0.001 };
    const name = `refund-${platform}`;
    await buckets.consume(name, policy, 4);
    const after = await buckets.refund(name, policy, 2);
    expect(after).toMatchObject({ allowed: true, limit: 5, remaining: 3, retryAfterSeconds: 0 });
    expect((await buckets.refund(name, policy, 5)).remaining).toBe(5);
    await expect(buckets.refund(name, policy, 6)).rejects.toThrow(/cost must be an integer from 1 to capacity 5/);
  });
});

describe('BucketService.refund while Redis cannot answer', () => {
  it("throws RateLimitUnavailableError with failureMode 'closed', and reports a full bucket with 'open'", async () => {
    const closed = await createApp(refundsAppModule({ redis: 'redis://127.0.0.1:1', failureMode: 'closed', timeoutMs: 50 }), 'express');
    const open = await createApp(refundsAppModule({ redis: 'redis://127.0.0.1:1', failureMode: 'open', timeoutMs: 50 }), 'express');
    try {
      const policy = { capacity: 3, refillPerSecond: 1 };
      await expect(closed.get(BucketService).refund('down', policy)).rejects.toBeInstanceOf(RateLimitUnavailableError);
      expect(await open.get(BucketService).refund('down', policy)).toMatchObject({ allowed: true, remaining: 3 });
    } finally {
      await closed.close();
      await open.close();
    }
  });
});
