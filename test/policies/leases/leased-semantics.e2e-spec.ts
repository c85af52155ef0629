import type { INestApplication } from '@nestjs/common';
import { Redis } from 'ioredis';
import { RateLimitInsights, type RateLimitModuleOptions } from 'nest-redis-rate-limit';
import { LeaseBook, type LeaseTake } from '../../../libs/rate-limit/src/engine/lease-book.js';
import { createApp } from '../../support/app.js';
import { RedisServer, scriptCalls, testPrefix, tokensOf } from '../../support/redis.js';
import { type Answer, count, leasedIn, Loader } from './leased-load.js';
import { leasedSemanticsAppModule } from './leased-semantics.controllers.js';

/**
 * What a leased policy does with cost, refusals, shadow mode, analytics and the memory store (issue 35,
 * item 4: each works, with a test). Every bucket is shared by all callers (keyBy 'everyone').
 */
describe('leased policies: cost, refusals, shadow mode, analytics, the memory store', () => {
  let server: RedisServer;
  let client: Redis;
  const apps: INestApplication[] = [];
  const loader = new Loader();
  /** What LeaseBook.take answered in this test, by kind. */
  let takes: Record<LeaseTake['kind'], number>;
  const take = LeaseBook.prototype.take;

  beforeAll(async () => {
    // A server of the test's own: script calls are counted on it.
    server = await RedisServer.start();
    client = new Redis(server.url);
    // Counts the kinds of leased decisions, so that a test can tell that its path was taken.
    LeaseBook.prototype.take = function (this: LeaseBook, request) {
      const found = take.call(this, request);
      const note = (t: LeaseTake) => {
        takes[t.kind]++;
        return t;
      };
      return 'then' in found ? found.then(note) : note(found);
    };
  });

  beforeEach(() => {
    takes = { spent: 0, exact: 0, refused: 0 };
  });

  afterEach(async () => {
    await Promise.all(apps.splice(0).map((app) => app.close().catch(() => undefined)));
  });

  afterAll(async () => {
    LeaseBook.prototype.take = take;
    loader.destroy();
    client?.disconnect();
    await server?.stop();
  });

  async function start(keyPrefix: string, options: RateLimitModuleOptions = {}): Promise<{ app: INestApplication; url: string }> {
    const app = await createApp(leasedSemanticsAppModule({ redis: server.url, keyPrefix, ...options }), 'express');
    apps.push(app);
    await app.listen(0, '127.0.0.1');
    return { app, url: await app.getUrl() };
  }

  /** The answers' `name` header values as numbers. */
  const header = (answers: readonly Answer[], name: string) => answers.map((a) => Number(a.headers[name]));

  it('spends the whole cost from a lease: 3 tokens per request, never more than 1,000 of 3,000 tokens admitted', async () => {
    const keyPrefix = testPrefix('leased-cost');
    const { url } = await start(keyPrefix);
    const before = await scriptCalls(client);
    const started = Date.now();
    const answers = await loader.load(`${url}/sem/cost`, 1_500, 32);
    const seconds = (Date.now() - started) / 1000;
    const calls = (await scriptCalls(client)) - before;
    const admitted = count(answers, 200);
    expect(admitted + count(answers, 429)).toBe(1_500);
    // 3,000 tokens and 0.001/s: at most 1,000 requests of cost 3, whatever was leased.
    expect(admitted).toBeLessThanOrEqual(Math.floor((3_000 + 0.001 * seconds) / 3));
    // Little lost: what a lease held below the cost when the bucket ran dry.
    expect(admitted).toBeGreaterThanOrEqual(995);
    // Out of Redis: at least the cost of every admitted request (the leases' fields count what they hold, spent or not).
    const tokens = await tokensOf(client, `${keyPrefix}{id:everyone}:cost`);
    expect(3 * admitted + tokens).toBeLessThanOrEqual(3_000 + 0.001 * seconds + 1e-6);
    // Decided from leases, not one call each.
    expect(takes.spent).toBeGreaterThanOrEqual(100);
    expect(calls).toBeLessThan(admitted);
    // A refusal says the bucket lacks the cost: fewer than 3 tokens left, a wait of at least a second.
    const refused = answers.filter((a) => a.status === 429);
    expect(Math.max(...header(refused, 'ratelimit-remaining'))).toBeLessThan(3);
    expect(Math.min(...header(refused, 'retry-after'))).toBeGreaterThanOrEqual(1);
  });

  it('answers a leased refusal 429 with Retry-After >= 1 and headers of an empty bucket, as an exact refusal', async () => {
    // Whether a lease call or an exact decision meets the empty bucket first depends on timing (a loaded
    // event loop may leave the key cold when it runs out): up to three buckets, until a lease call refused.
    for (let attempt = 0; attempt < 3 && takes.refused === 0; attempt++) {
      const keyPrefix = testPrefix(`leased-refuse-${attempt}`);
      const { url } = await start(keyPrefix);
      const started = Date.now();
      const answers = await loader.load(`${url}/sem/refuse`, 1_500, 32);
      const seconds = (Date.now() - started) / 1000;
      expect(count(answers, 200)).toBeLessThanOrEqual(1_000 + Math.ceil(seconds));
      expect(count(answers, 200) + count(answers, 429)).toBe(1_500);
      const refused = answers.filter((a) => a.status === 429);
      // 1,000 tokens, 1 per second, cost 1: nothing remains, the next token comes within a second, the bucket is full within 1,000 s.
      expect(new Set(header(refused, 'retry-after'))).toEqual(new Set([1]));
      expect(new Set(header(refused, 'ratelimit-remaining'))).toEqual(new Set([0]));
      expect(new Set(header(refused, 'ratelimit-limit'))).toEqual(new Set([1_000]));
      for (const reset of header(refused, 'ratelimit-reset')) {
        expect(reset).toBeGreaterThanOrEqual(1);
        expect(reset).toBeLessThanOrEqual(1_000);
      }
    }
    // Some refusals were the lease's (its call found the bucket without the cost), not only exact ones.
    expect(takes.refused).toBeGreaterThan(0);
  });

  it('never refuses in shadow mode (enforce: false) and drains the bucket through the lease', async () => {
    const keyPrefix = testPrefix('leased-shadow');
    const { url } = await start(keyPrefix);
    const key = `${keyPrefix}{id:everyone}:shadow`;
    const started = Date.now();
    let leasedSeen = 0;
    let loading = true;
    // The bucket's lease fields while the load runs: the lease is in Redis.
    const watching = (async () => {
      while (loading) {
        leasedSeen = Math.max(leasedSeen, leasedIn(await client.hgetall(key)));
        await new Promise((r) => setTimeout(r, 5));
      }
    })();
    const answers = await loader.load(`${url}/sem/shadow`, 1_500, 32);
    loading = false;
    await watching;
    const seconds = (Date.now() - started) / 1000;
    expect(count(answers, 200)).toBe(1_500);
    // Drained: what a shadow policy would have admitted left the bucket, most of it from leases.
    expect(takes.spent).toBeGreaterThanOrEqual(50);
    expect(leasedSeen).toBeGreaterThan(0);
    const fields = await client.hgetall(key);
    expect(Number(fields.tokens)).toBeLessThan(1 + seconds);
    expect(Number(fields.tokens)).toBeGreaterThanOrEqual(0);
  });

  it('counts leased decisions in the analytics as allowed and refused, as exact ones (operations: true)', async () => {
    const keyPrefix = testPrefix('leased-analytics');
    const { app, url } = await start(keyPrefix, { operations: { syncMs: 250 } });
    const answers = await loader.load(`${url}/sem/refuse`, 1_200, 32);
    expect(takes.spent).toBeGreaterThan(0);
    const insights = app.get(RateLimitInsights);
    const expected = { allowed: count(answers, 200), refused: count(answers, 429) };
    let counted = { allowed: 0, refused: 0 };
    const deadline = Date.now() + 5_000;
    while (Date.now() < deadline) {
      const series = await insights.series('refuse', { seconds: 60 });
      counted = series.reduce((sum, p) => ({ allowed: sum.allowed + p.allowed, refused: sum.refused + p.refused }), {
        allowed: 0,
        refused: 0,
      });
      if (counted.allowed + counted.refused >= 1_200) break;
      await new Promise((r) => setTimeout(r, 50));
    }
    expect(counted).toEqual(expected);
  });

  it('decides exactly on the memory store with lease: the same answers as without', async () => {
    const run = async (options: RateLimitModuleOptions) => {
      const { url } = await start(testPrefix('leased-memory'), { store: 'memory', ...options });
      const answers = await loader.load(`${url}/sem/cost`, 1_050, 32);
      return {
        statuses: [count(answers, 200), count(answers, 429)],
        remaining: header(
          answers.filter((a) => a.status === 200),
          'ratelimit-remaining',
        ).sort((a, b) => a - b),
        // 3 tokens at 0.001/s: about 3,000 s (less the refill since the bucket ran dry).
        waits: header(
          answers.filter((a) => a.status === 429),
          'retry-after',
        ).every((wait) => wait >= 2_990 && wait <= 3_000),
      };
    };
    const exact = await run({});
    const leased = await run({ lease: true });
    expect(takes).toEqual({ spent: 0, exact: 0, refused: 0 });
    expect(leased).toEqual(exact);
    // Each of the 1,000 admitted requests took 3 tokens, each remaining count once: 2,997, 2,994, ..., 0.
    expect(exact.statuses).toEqual([1_000, 50]);
    expect(exact.waits).toBe(true);
    expect(exact.remaining).toEqual(Array.from({ length: 1_000 }, (_, i) => 3 * i));
  });
});
