import { Test, type TestingModule } from '@nestjs/testing';
import { Redis } from 'ioredis';
import { BucketService, RateLimitModule } from 'nest-redis-rate-limit';
import { LogRecorder } from '../../support/log-recorder.js';
import { RedisServer } from '../../support/redis.js';
import { worstExcess } from '../../support/transpiled-child.js';

/**
 * Issue 32, item 2: thousands of acquire() calls started at once in one process, on the default options,
 * share script calls (each bucket's calls one batch) instead of queueing one call each behind the others at
 * Redis past timeoutMs. What it asserts is bounded by Redis' clock and by counts, not by how fast the machine is.
 */

/** Script calls a Redis server has run (INFO commandstats: EVALSHA and EVAL). */
async function scriptCalls(admin: Redis): Promise<number> {
  const stats = await admin.info('commandstats');
  let calls = 0;
  for (const [, n] of stats.matchAll(/^cmdstat_eval(?:sha)?:calls=(\d+)/gm)) calls += Number(n);
  return calls;
}

describe('a burst of acquire() calls on the default options (issue 32, item 2)', () => {
  let redis: RedisServer | undefined;
  let moduleRef: TestingModule | undefined;

  afterAll(async () => {
    await moduleRef?.close();
    await redis?.stop();
  });

  it('reserves 8,000 concurrent calls in Redis: none ahead of its turn, none decided by failureMode, B + R·t kept', async () => {
    redis = await RedisServer.start();
    const recorder = new LogRecorder();
    moduleRef = await Test.createTestingModule({ imports: [RateLimitModule.forRoot({ redis: redis.url })] }).compile();
    moduleRef.useLogger(recorder);
    await moduleRef.init();
    const buckets = moduleRef.get(BucketService);
    const policy = { capacity: 10, refillPerSecond: 4_000 };
    await buckets.peek('burst', policy);
    const admin = new Redis(redis.url);
    const before = await scriptCalls(admin);
    const decisions = await Promise.all(
      Array.from({ length: 8_000 }, async () => {
        const decision = await buckets.acquire('burst', policy);
        return { turnAt: decision.turnAt, resolvedAt: Date.now() };
      }),
    );
    // No call timed out or failed: failureMode decided none of them (it logs each outage).
    expect(recorder.lines.filter((l) => l.level !== 'log')).toEqual([]);
    // Each was reserved in Redis (a turn by Redis' clock), and went at its turn or later (same machine's clock, ±2 ms).
    expect(decisions.filter((d) => d.turnAt === undefined)).toEqual([]);
    expect(decisions.filter((d) => d.resolvedAt < d.turnAt! - 2)).toEqual([]);
    // In the order of the calls, and never more than 10 + 4,000·(t + 1 ms) in any window.
    const turns = decisions.map((d) => d.turnAt!);
    expect(turns).toEqual([...turns].sort((a, b) => a - b));
    expect(worstExcess(turns, 10, 4_000)).toBeLessThanOrEqual(4_000 / 1000 + 1e-9);
    // Coalesced like takes: the first call alone, then shared calls of at most 64 decisions (125 for the
    // other 7,999), each bucket's reservations in one batch. One call per acquire() was 8,000 calls, which
    // queued behind each other at Redis past timeoutMs.
    const calls = (await scriptCalls(admin)) - before;
    await admin.quit();
    expect(calls).toBeGreaterThanOrEqual(2);
    expect(calls).toBeLessThanOrEqual(1 + Math.ceil(7_999 / 64));
  }, 60_000);
});
