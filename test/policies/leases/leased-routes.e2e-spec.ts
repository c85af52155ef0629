import { Agent, get } from 'node:http';
import type { INestApplication } from '@nestjs/common';
import { Redis } from 'ioredis';
import { Controller, Get, Module } from '@nestjs/common';
import { RateLimit, RateLimitModule, type RateLimitModuleOptions, type RateLimitPolicy } from 'nest-redis-rate-limit';
import { createApp } from '../../support/app.js';
import { RedisServer, scriptCalls, testPrefix } from '../../support/redis.js';
import { leasesAppModule } from './leases.controllers.js';

/**
 * Leased mode on route policies (issue 35): a hot bucket is decided from this instance's lease with a
 * Redis call for a batch, never more admitted than the bucket holds, unspent tokens given back at close,
 * refunds into the lease, stacked policies all or none; and what cannot be leased stops the start.
 */
describe('leased policies', () => {
  let server: RedisServer;
  let client: Redis;
  const apps: INestApplication[] = [];
  const agent = new Agent({ keepAlive: true, maxSockets: 64 });

  beforeAll(async () => {
    // A server of the test's own: script calls are counted on it.
    server = await RedisServer.start();
    client = new Redis(server.url);
  });

  afterAll(async () => {
    await Promise.all(apps.map((app) => app.close().catch(() => undefined)));
    agent.destroy();
    client?.disconnect();
    await server?.stop();
  });

  async function start(keyPrefix: string, options: RateLimitModuleOptions = {}): Promise<{ app: INestApplication; url: string }> {
    const app = await createApp(leasesAppModule({ redis: server.url, keyPrefix, ...options }), 'express');
    apps.push(app);
    await app.listen(0, '127.0.0.1');
    return { app, url: await app.getUrl() };
  }

  /** `total` GETs of `path`, `concurrency` at a time; the statuses and the ratelimit-remaining headers in order of answer. */
  async function load(url: string, path: string, total: number, concurrency: number): Promise<{ statuses: number[]; remaining: number[] }> {
    const statuses: number[] = [];
    const remaining: number[] = [];
    let next = 0;
    const worker = async () => {
      while (next < total) {
        next++;
        const res = await fetchStatus(`${url}${path}`);
        statuses.push(res.status);
        remaining.push(Number(res.remaining));
      }
    };
    await Promise.all(Array.from({ length: concurrency }, worker));
    return { statuses, remaining };
  }

  function fetchStatus(url: string): Promise<{ status: number; remaining: string | undefined }> {
    return new Promise((resolve, reject) => {
      const req = get(url, { agent }, (res) => {
        res.resume();
        res.on('end', () => resolve({ status: res.statusCode ?? 0, remaining: res.headers['ratelimit-remaining'] as string | undefined }));
      });
      req.on('error', reject);
    });
  }

  const count = (statuses: number[], status: number) => statuses.filter((s) => s === status).length;

  it('decides a hot bucket with at most one Redis call per 20 decisions once it is hot, all allowed', async () => {
    const keyPrefix = testPrefix('leases-hot');
    const { url } = await start(keyPrefix);
    // Warm-up: the demand is measured over 100 ms windows before a batch is leased.
    await load(url, '/leased/hot', 1_000, 32);
    const before = await scriptCalls(client);
    const { statuses } = await load(url, '/leased/hot', 4_000, 32);
    const calls = (await scriptCalls(client)) - before;
    expect(count(statuses, 200)).toBe(4_000);
    expect(calls / 4_000).toBeLessThanOrEqual(0.05);
    // The bucket has a lease of this instance in it.
    const fields = await client.hgetall(`${keyPrefix}{id:everyone}:hot`);
    expect(Object.keys(fields).filter((f) => f.startsWith('l:'))).toHaveLength(1);
    expect(Number(fields.o)).toBeGreaterThan(0);
  }, 30_000);

  it('refuses no decision of a burst larger than a batch while the bucket holds plenty: waiters ask again', async () => {
    const keyPrefix = testPrefix('leases-burst');
    const { url } = await start(keyPrefix);
    await load(url, '/leased/burst', 600, 8);
    const { statuses } = await load(url, '/leased/burst', 3_000, 64);
    expect(count(statuses, 200)).toBe(3_000);
  }, 30_000);

  it('never admits more than the bucket holds: two instances on a 200-token bucket refilling 20/s', async () => {
    const keyPrefix = testPrefix('leases-small');
    const [a, b] = [await start(keyPrefix), await start(keyPrefix)];
    const started = Date.now();
    const [ra, rb] = await Promise.all([load(a.url, '/leased/small', 1_500, 24), load(b.url, '/leased/small', 1_500, 24)]);
    const seconds = (Date.now() - started) / 1000;
    const admitted = count(ra.statuses, 200) + count(rb.statuses, 200);
    expect(count(ra.statuses, 200) + count(ra.statuses, 429)).toBe(1_500);
    expect(admitted).toBeLessThanOrEqual(200 + Math.ceil(20 * seconds));
    // Little is lost: at most a batch per instance per lease, and what refills meanwhile.
    expect(admitted).toBeGreaterThanOrEqual(200 - 2 * 20);
  }, 30_000);

  it('gives its unspent tokens back when the application closes', async () => {
    const keyPrefix = testPrefix('leases-close');
    const { app, url } = await start(keyPrefix);
    await load(url, '/leased/hot', 2_000, 32);
    const key = `${keyPrefix}{id:everyone}:hot`;
    const held = await client.hgetall(key);
    const lease = Object.keys(held).find((f) => f.startsWith('l:'));
    expect(lease).toBeDefined();
    const leased = Number(held[lease!].split(':')[0]);
    expect(leased).toBeGreaterThan(0);
    await app.close();
    apps.splice(apps.indexOf(app), 1);
    const after = await client.hgetall(key);
    expect(Object.keys(after).filter((f) => f.startsWith('l:'))).toEqual([]);
    expect(after.o).toBeUndefined();
    // What it held came back (refill aside, the bucket holds at least that much more).
    expect(Number(after.tokens)).toBeGreaterThanOrEqual(Number(held.tokens) + 1);
  }, 30_000);

  it('gives the unspent tokens of a lease back shortly before it ends when the traffic stops, without a close: none lost', async () => {
    const keyPrefix = testPrefix('leases-cold');
    const { url } = await start(keyPrefix);
    // 1,000 tokens refilling 1 a second, leased in batches of up to 50: 600 admitted, from leases once hot.
    const started = Date.now();
    const { statuses } = await load(url, '/leased/refund/ok', 600, 16);
    expect(count(statuses, 200)).toBe(600);
    const key = `${keyPrefix}{id:everyone}:refunded`;
    const held = await client.hgetall(key);
    expect(Object.keys(held).filter((f) => f.startsWith('l:'))).toHaveLength(1);
    // The lease lives 500 ms (the default); what it holds goes back 100 ms before its end.
    await new Promise((resolve) => setTimeout(resolve, 600));
    const after = await client.hgetall(key);
    const seconds = (Date.now() - started) / 1000;
    expect(Object.keys(after).filter((f) => f.startsWith('l:'))).toEqual([]);
    expect(after.o).toBeUndefined();
    // Every token not admitted is in the bucket again: 1,000 - 600, and the refill since (1 a second).
    expect(Number(after.tokens)).toBeGreaterThanOrEqual(400 - 1e-6);
    expect(Number(after.tokens)).toBeLessThanOrEqual(400 + seconds + 1e-6);
  }, 30_000);

  it('puts a refunded decision back into the lease: refunds of failures cost nothing and no call', async () => {
    const keyPrefix = testPrefix('leases-refund');
    const { url } = await start(keyPrefix);
    // Hot on successes first (a batch of up to 50 is leased).
    const warm = await load(url, '/leased/refund/ok', 600, 16);
    expect(count(warm.statuses, 200)).toBe(600);
    const before = await scriptCalls(client);
    const failed = await load(url, '/leased/refund/fail', 600, 16);
    expect(count(failed.statuses, 502)).toBe(600);
    // Each failure is taken from the lease and put back: the lease never empties, so hardly a call is sent.
    expect((await scriptCalls(client)) - before).toBeLessThanOrEqual(600 / 20);
  }, 30_000);

  it('decides a leased policy stacked over an exact one all or none: the exact refusal puts the leased token back', async () => {
    const keyPrefix = testPrefix('leases-stacked');
    const { url } = await start(keyPrefix);
    // The per-caller bucket (5) refuses after 5; the leased global one is hot meanwhile.
    const { statuses } = await load(url, '/leased/stacked', 400, 8);
    expect(count(statuses, 200)).toBe(5);
    expect(count(statuses, 429)).toBe(395);
    const global = await client.hgetall(`${keyPrefix}{id:everyone}:global`);
    // Out of the bucket: the 5 admitted, and what the lease holds; nothing for the 395 refused.
    const leased = Object.entries(global)
      .filter(([f]) => f.startsWith('l:'))
      .reduce((sum, [, v]) => sum + Number(v.split(':')[0]), 0);
    expect(10_000 - Number(global.tokens) - leased).toBeLessThanOrEqual(5 + 1);
  }, 30_000);

  describe('what cannot be leased stops the start', () => {
    async function startWith(policy: RateLimitPolicy, options: RateLimitModuleOptions = {}): Promise<unknown> {
      @Controller('bad')
      class BadController {
        @Get()
        @RateLimit(policy)
        get(): string {
          return 'ok';
        }
      }
      @Module({ imports: [RateLimitModule.forRoot({ store: 'memory', ...options })], controllers: [BadController] })
      class BadModule {}
      try {
        const app = await createApp(BadModule, 'express');
        await app.close();
        return undefined;
      } catch (error) {
        return error;
      }
    }

    it.each([
      [
        { capacity: 10, refillPerSecond: 1, blockSeconds: 60, lease: true },
        {},
        'ERR_RATE_LIMIT_LEASE_UNSUPPORTED',
        /lease cannot be used with blockSeconds .* on BadController\.get/,
      ],
      [
        { capacity: 10, refillPerSecond: 1, blockSeconds: 60 },
        { lease: true },
        'ERR_RATE_LIMIT_LEASE_UNSUPPORTED',
        /the module's lease applies to it: give it lease: false/,
      ],
      [{ capacity: () => 10, refillPerSecond: 1, lease: true }, {}, 'ERR_RATE_LIMIT_LEASE_UNSUPPORTED', /numbers computed per request/],
      [
        { capacity: 10, refillPerSecond: 1, lease: { lifeMs: 20 } },
        {},
        'ERR_RATE_LIMIT_INVALID_POLICY',
        /lease\.lifeMs must be an integer from 50 to 10000 \(got 20\) on BadController\.get/,
      ],
      [
        { capacity: 10, refillPerSecond: 1, lease: { maxBatch: 0.5 } },
        {},
        'ERR_RATE_LIMIT_INVALID_POLICY',
        /lease\.maxBatch must be an integer/,
      ],
      [{ capacity: 10, refillPerSecond: 1, lease: { life: 100 } }, {}, 'ERR_RATE_LIMIT_UNKNOWN_OPTION', /lease has no option "life"/],
      [
        { capacity: 10, refillPerSecond: 1, lease: 'yes' },
        {},
        'ERR_RATE_LIMIT_INVALID_POLICY',
        /lease must be true, false or \{ lifeMs\?, maxBatch\? \}/,
      ],
      [{ capacity: 10, refillPerSecond: 1 }, { lease: 1 }, 'ERR_RATE_LIMIT_INVALID_POLICY', /RateLimitModule lease must be true, false/],
    ] as [RateLimitPolicy, RateLimitModuleOptions, string, RegExp][])(
      '%j with module options %j: %s',
      async (policy, options, code, message) => {
        const error = (await startWith(policy, options)) as { code?: string; message?: string } | undefined;
        expect(error?.code).toBe(code);
        expect(error?.message).toMatch(message);
      },
    );

    it('starts a leased policy with lease: false beside a module lease, and a penalty on it', async () => {
      expect(await startWith({ capacity: 10, refillPerSecond: 1, blockSeconds: 60, lease: false }, { lease: true })).toBeUndefined();
    });
  });
});
