import type { INestApplication } from '@nestjs/common';
import { Redis } from 'ioredis';
import request from 'supertest';
import { createApp, PLATFORMS } from '../../support/app.js';
import { watchLoopDelay } from '../../support/loop-delay.js';
import { expectCountdown } from '../../support/countdown.js';
import { deleteKeys, redisUrl, testPrefix } from '../../support/redis.js';
import { perRequestAppModule } from './per-request.controllers.js';

/**
 * A resolver that never answers is given up after `timeoutMs` and the policy's static numbers decide
 * (README, per-request limits). A wall-clock claim: this file runs in the `timing` project, in band, so
 * no other test file shares the CPU with it (per-request.e2e-spec.ts holds the rest of the behaviour).
 */
describe.each(PLATFORMS)('a hanging resolver on %s', (platform) => {
  const prefix = testPrefix(`resolver-deadline-${platform}`);
  const timeoutMs = 150;
  let client: Redis;
  let app: INestApplication;

  beforeAll(async () => {
    client = new Redis(await redisUrl());
    app = await createApp(perRequestAppModule({ redis: await redisUrl(), keyPrefix: prefix, timeoutMs }), platform);
    await app.listen(0, '127.0.0.1');
  });

  afterAll(async () => {
    await app?.close();
    await deleteKeys(client, prefix);
    await client.quit();
  });

  it('is given up within timeoutMs: two requests answered (static capacity 1: 200, then 429) in under 2 × timeoutMs + 400 ms', async () => {
    const url = await app.getUrl();
    const loop = watchLoopDelay();
    const started = performance.now();
    await request(url).get('/dyn/hanging').expect(200);
    const denied = await request(url).get('/dyn/hanging').expect(429);
    const elapsed = performance.now() - started;
    loop.stop();
    expectCountdown(denied.headers['retry-after'], 1000, started);
    // Each waits for the resolver at most timeoutMs: the slack is HTTP and the store, in band, plus what
    // the event loop stood still meanwhile (beside other CPU-bound work). Waiting for the resolver twice
    // as long, or for ever, still fails: the loop delay is what the process lost, not what it waited.
    const loopMs = loop.over(started, started + elapsed);
    expect({ elapsed, loopMs, less: elapsed - loopMs < 2 * timeoutMs + 400 }).toEqual({ elapsed, loopMs, less: true });
  });
});
