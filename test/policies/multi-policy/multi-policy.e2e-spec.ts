import { Test, type TestingModule } from '@nestjs/testing';
import request from 'supertest';
import { BucketService, RateLimitModule, type RateLimitModuleOptions } from 'nest-redis-rate-limit';
import { createApp, PLATFORMS } from '../../support/app.js';
import { redisUrl, tokensOf } from '../../support/redis.js';
import { expectCountdown } from '../../support/countdown.js';
import { redisScenario } from '../../support/scenario.js';
import { multiPolicyAppModule } from './app.module.js';

/** Tokens stored in a bucket hash right now (no refill applied); throws when the bucket does not exist. */
const storedTokens = tokensOf;

describe.each(PLATFORMS)('several policies on one route decide as one on %s', (platform) => {
  const scenario = redisScenario(`multi-policy-${platform}`);

  /** Starts an app listening on a port of its own; returns its base URL and its key prefix. */
  async function start(options: RateLimitModuleOptions = {}): Promise<{ url: string; keyPrefix: string }> {
    const keyPrefix = scenario.nextKeyPrefix();
    const app = await createApp(multiPolicyAppModule({ redis: await redisUrl(), keyPrefix, ...options }), platform);
    scenario.track(app);
    await app.listen(0, '127.0.0.1');
    return { url: await app.getUrl(), keyPrefix };
  }

  it('spends no burst token on requests the hourly quota denies, even 20 in a row', async () => {
    const { url, keyPrefix } = await start();
    const since = performance.now();
    for (let i = 0; i < 3; i++) await request(url).get('/multi/quota').expect(200);
    const burstKey = `${keyPrefix}{ip:127.0.0.1}:burst`;
    const hourlyKey = `${keyPrefix}{ip:127.0.0.1}:hourly`;
    expect(await storedTokens(scenario.client, burstKey)).toBeCloseTo(7, 1);
    expect(await storedTokens(scenario.client, hourlyKey)).toBeCloseTo(0, 2);
    for (let i = 0; i < 20; i++) {
      const denied = await request(url).get('/multi/quota').expect(429);
      // The quota's next token is 1200 s away (3 per hour); the burst bucket would allow.
      expectCountdown(denied.headers['retry-after'], 1200, since);
    }
    // 20 denials later the burst bucket still holds 7 tokens (plus what 0.01/s refilled meanwhile).
    const burstAfter = await storedTokens(scenario.client, burstKey);
    expect(burstAfter).toBeGreaterThanOrEqual(7);
    expect(burstAfter).toBeLessThan(7.2);
    expect(await storedTokens(scenario.client, hourlyKey)).toBeLessThan(0.05);
  });

  it('allows exactly 3 of 30 simultaneous requests on the quota route and drains the burst bucket by exactly 3', async () => {
    const { url, keyPrefix } = await start();
    const responses = await Promise.all(Array.from({ length: 30 }, () => request(url).get('/multi/quota')));
    const statuses = responses.map((r) => r.status);
    expect(statuses.filter((s) => s === 200)).toHaveLength(3);
    expect(statuses.filter((s) => s === 429)).toHaveLength(27);
    const burst = await storedTokens(scenario.client, `${keyPrefix}{ip:127.0.0.1}:burst`);
    expect(burst).toBeGreaterThanOrEqual(7);
    expect(burst).toBeLessThan(7.2);
  });

  it('describes the policy with the fewest remaining tokens on an allowed response', async () => {
    const { url } = await start();
    // burst 9 of 10 left, hourly 2 of 3: the hourly quota is described.
    const quota = await request(url).get('/multi/quota').expect(200);
    expect(quota.headers['x-ratelimit-limit']).toBe('3');
    expect(quota.headers['x-ratelimit-remaining']).toBe('2');
    expect(quota.headers['x-ratelimit-reset']).toBe('1200');
    expect(quota.headers['ratelimit-limit']).toBe('3');
    expect(quota.headers['ratelimit-remaining']).toBe('2');
    expect(quota.headers['ratelimit-policy']).toBe('3;w=3600');
    // tight burst 1 of 2 left, loose hourly 99 of 100: the burst is described.
    const burst = await request(url).get('/multi/burst').expect(200);
    expect(burst.headers['x-ratelimit-limit']).toBe('2');
    expect(burst.headers['x-ratelimit-remaining']).toBe('1');
    expect(burst.headers['x-ratelimit-reset']).toBe('10');
    expect(burst.headers['ratelimit-policy']).toBe('2;w=20');
  });

  it('describes the smaller capacity when two policies have as many tokens left', async () => {
    const { url } = await start();
    // tie-big: 4 - 2 = 2 left; tie-small: 3 - 1 = 2 left.
    const res = await request(url).get('/multi/tie').expect(200);
    expect(res.headers['x-ratelimit-limit']).toBe('3');
    expect(res.headers['x-ratelimit-remaining']).toBe('2');
    expect(res.headers['ratelimit-policy']).toBe('3;w=300');
  });

  it('describes the policy with the longest Retry-After on a 429, whichever policy was declared first', async () => {
    const { url } = await start();
    const burstSince = performance.now();
    await request(url).get('/multi/burst').expect(200);
    await request(url).get('/multi/burst').expect(200);
    // tight burst empty (next token in 10 s); loose hourly holds 98 but the verdict is one.
    const denied = await request(url).get('/multi/burst').expect(429);
    expectCountdown(denied.headers['retry-after'], 10, burstSince);
    expect(denied.headers['x-ratelimit-limit']).toBe('2');
    expect(denied.headers['x-ratelimit-remaining']).toBe('0');
    expect(denied.headers['ratelimit-policy']).toBe('2;w=20');
    expect(denied.body).toEqual({ statusCode: 429, message: 'Too Many Requests', retryAfter: Number(denied.headers['retry-after']) });

    const quotaSince = performance.now();
    for (let i = 0; i < 3; i++) await request(url).get('/multi/quota').expect(200);
    // burst holds 7 (ready at once), hourly none (1200 s): the hourly quota is described.
    const quota = await request(url).get('/multi/quota').expect(429);
    expectCountdown(quota.headers['retry-after'], 1200, quotaSince);
    expect(quota.headers['x-ratelimit-limit']).toBe('3');
    expect(quota.headers['x-ratelimit-remaining']).toBe('0');
    expect(quota.body.retryAfter).toBe(Number(quota.headers['retry-after']));
  });

  it('lists every policy in draft-8 headers, in declaration order, on allowed and denied responses', async () => {
    const { url } = await start({ standardHeaders: 'draft-8', legacyHeaders: false });
    const since = performance.now();
    const first = await request(url).get('/multi/quota').expect(200);
    expect(first.headers['ratelimit-policy']).toBe('"burst";q=10;w=1000, "hourly";q=3;w=3600');
    expect(first.headers['ratelimit']).toBe('"burst";r=9;t=100, "hourly";r=2;t=1200');
    expect(first.headers['x-ratelimit-limit']).toBeUndefined();
    await request(url).get('/multi/quota').expect(200);
    await request(url).get('/multi/quota').expect(200);
    const denied = await request(url).get('/multi/quota').expect(429);
    expect(denied.headers['ratelimit-policy']).toBe('"burst";q=10;w=1000, "hourly";q=3;w=3600');
    // The denial left the burst bucket at 7: 3 tokens (300 s) short of full; the quota 3 tokens (3600 s).
    const [, burstFull, quotaFull] = /^"burst";r=7;t=(\d+), "hourly";r=0;t=(\d+)$/.exec(denied.headers['ratelimit']) ?? [];
    expectCountdown(burstFull, 300, since);
    expectCountdown(quotaFull, 3600, since);
    expectCountdown(denied.headers['retry-after'], 1200, since);

    const unnamed = await request(url).get('/multi/unnamed').expect(200);
    expect(unnamed.headers['ratelimit-policy']).toBe(
      '"MultiPolicyController.unnamed#0";q=5;w=500, "MultiPolicyController.unnamed#1";q=2;w=200',
    );
    expect(unnamed.headers['ratelimit']).toBe('"MultiPolicyController.unnamed#0";r=4;t=100, "MultiPolicyController.unnamed#1";r=1;t=100');
  });
});

describe('BucketService.consumeAll decides several buckets as one', () => {
  const scenario = redisScenario('multi-policy-service');
  const FIVE = { capacity: 5, refillPerSecond: 0.01 };
  const THREE = { capacity: 3, refillPerSecond: 0.01 };
  const TEN = { capacity: 10, refillPerSecond: 0.01 };
  let moduleRef: TestingModule;
  let buckets: BucketService;

  beforeAll(async () => {
    moduleRef = await Test.createTestingModule({
      imports: [RateLimitModule.forRoot({ redis: await redisUrl(), keyPrefix: scenario.prefix })],
    }).compile();
    await moduleRef.init();
    buckets = moduleRef.get(BucketService);
  });

  afterAll(async () => {
    await moduleRef.close();
  });

  it('drains both buckets when both hold the cost, and neither when one does not', async () => {
    const entries = [
      { name: 'export:a', policy: FIVE, cost: 2 },
      { name: 'export:b', policy: THREE, cost: 2 },
    ];
    const first = await buckets.consumeAll(entries);
    expect(first.allowed).toBe(true);
    expect(first.decisions.map((d) => [d.allowed, d.remaining])).toEqual([
      [true, 3],
      [true, 1],
    ]);
    // b holds 1 of the 2 it needs: nothing is taken from a either.
    const second = await buckets.consumeAll(entries);
    expect(second.allowed).toBe(false);
    expect(second.decisions.map((d) => [d.allowed, d.remaining])).toEqual([
      [false, 3],
      [false, 1],
    ]);
    expect(second.decisions[1].retryAfterSeconds).toBe(100);
    expect((await buckets.peek('export:a', FIVE)).remaining).toBe(3);
    expect((await buckets.peek('export:b', THREE)).remaining).toBe(1);
    // a alone still has its tokens.
    expect((await buckets.consume('export:a', FIVE, 3)).allowed).toBe(true);
  });

  it('allows exactly 5 of 40 simultaneous calls over a 5-token and a 10-token bucket; the 10-token bucket keeps 5', async () => {
    const decisions = await Promise.all(
      Array.from({ length: 40 }, () =>
        buckets.consumeAll([
          { name: 'race:small', policy: FIVE },
          { name: 'race:large', policy: TEN },
        ]),
      ),
    );
    expect(decisions.filter((d) => d.allowed)).toHaveLength(5);
    // Each allowed call saw its own remaining count in both buckets: 4..0 and 9..5.
    const allowed = decisions.filter((d) => d.allowed);
    expect(allowed.map((d) => d.decisions[0].remaining).sort((a, b) => a - b)).toEqual([0, 1, 2, 3, 4]);
    expect(allowed.map((d) => d.decisions[1].remaining).sort((a, b) => a - b)).toEqual([5, 6, 7, 8, 9]);
    expect((await buckets.peek('race:large', TEN)).remaining).toBe(5);
    expect((await buckets.peek('race:small', FIVE)).remaining).toBe(0);
  });

  it('makes one bucket full again with reset() without touching the other', async () => {
    const entries = [
      { name: 'reset:a', policy: THREE },
      { name: 'reset:b', policy: THREE },
    ];
    await buckets.consumeAll(entries);
    await buckets.consumeAll(entries);
    await buckets.reset('reset:a');
    expect((await buckets.peek('reset:a', THREE)).remaining).toBe(3);
    expect((await buckets.peek('reset:b', THREE)).remaining).toBe(1);
  });
});
