import { Module } from '@nestjs/common';
import request from 'supertest';
import { RateLimitModule } from 'nest-redis-rate-limit';
import { createApp } from '../../support/app.js';
import { keysUnder, redisUrl } from '../../support/redis.js';
import { redisScenario } from '../../support/scenario.js';
import { SharedNamesController } from './shared-names.controller.js';

/**
 * Issue 22 over HTTP (Express; the stores are platform-free), against the real Redis:
 * - finding 2: a refused request with a large client-chosen cost starts a penalty sized by the policy's
 *   cost (1 for a cost function), so it blocks the client instead of withholding nothing;
 * - finding 6: two routes sharing a `name` with different numbers, in both orders: the looser one
 *   honours the strict one's running penalty and never shortens the key's TTL.
 * Each test has its own app and key prefix. The exact Retry-After values hold while consecutive
 * requests are less than a second apart (timing project).
 */
describe('penalties with per-request costs and shared names (issue 22)', () => {
  const scenario = redisScenario('shared-names');

  async function start(): Promise<{ get: (path: string) => request.Test; keyPrefix: string }> {
    const keyPrefix = scenario.nextKeyPrefix();
    const url = await redisUrl();
    @Module({ imports: [RateLimitModule.forRoot({ redis: url, keyPrefix })], controllers: [SharedNamesController] })
    class SharedNamesModule {}
    const app = await createApp(SharedNamesModule, 'express');
    scenario.track(app);
    return { get: (path) => request(app.getHttpServer()).get(path), keyPrefix };
  }

  /** The TTL of the one bucket under `keyPrefix`, in ms. */
  async function ttlOf(keyPrefix: string): Promise<number> {
    const keys = await keysUnder(scenario.client, keyPrefix);
    expect(keys).toHaveLength(1);
    return scenario.client.pttl(keys[0]);
  }

  it('a refused n=100 penalises the client for 5 s: the next n=1 is refused with Retry-After 5', async () => {
    const { get } = await start();
    await get('/shared/search?n=95').expect(200);
    await get('/shared/search?n=100').expect(429);
    const blocked = await get('/shared/search?n=1').expect(429);
    expect(blocked.headers['retry-after']).toBe('5');
  });

  it('stricter first: the looser route honours the 60 s penalty and keeps its TTL', async () => {
    const { get, keyPrefix } = await start();
    await get('/shared/strict').expect(200);
    await get('/shared/strict').expect(200);
    expect((await get('/shared/strict').expect(429)).headers['retry-after']).toBe('60');
    expect((await get('/shared/loose').expect(429)).headers['retry-after']).toBe('60');
    expect((await get('/shared/strict').expect(429)).headers['retry-after']).toBe('60');
    // The penalty's TTL (61 s), not the looser route's idle 6 s.
    expect(await ttlOf(keyPrefix)).toBeGreaterThan(55_000);
  });

  it('looser first: after the looser route drained the bucket, the strict refusal penalises both routes', async () => {
    const { get, keyPrefix } = await start();
    for (let i = 0; i < 3; i++) await get('/shared/loose').expect(200);
    expect((await get('/shared/strict').expect(429)).headers['retry-after']).toBe('60');
    expect((await get('/shared/loose').expect(429)).headers['retry-after']).toBe('60');
    expect(await ttlOf(keyPrefix)).toBeGreaterThan(55_000);
  });
});
