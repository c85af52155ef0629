import { Redis } from 'ioredis';
import { MemoryBucketStore, RedisBucketStore } from 'nest-redis-rate-limit';
import type { BucketStore } from 'nest-redis-rate-limit';
import { toDecision } from '../../libs/rate-limit/src/bucket/token-bucket.js';
import { deleteKeys, redisUrl, testPrefix } from '../support/redis.js';

/**
 * One table of cases, run through the Lua script on the real Redis and through the memory store.
 * `at` is the clock in ms (the script's test-only `now` argument); tokens are after the step.
 */
interface Step {
  at: number;
  cost: number;
  peek?: boolean;
  allowed: boolean;
  tokens: number;
  retryAfter?: number;
  reset?: number;
}
interface Case {
  name: string;
  capacity: number;
  refillPerSecond: number;
  steps: Step[];
}

const T0 = 1_750_000_000_000;

const CASES: Case[] = [
  {
    name: 'a new bucket starts full and gives a token',
    capacity: 10,
    refillPerSecond: 1,
    steps: [{ at: 0, cost: 1, allowed: true, tokens: 9, reset: 1 }],
  },
  {
    name: 'refill after idle time is capped at the capacity',
    capacity: 10,
    refillPerSecond: 1,
    steps: [
      { at: 0, cost: 10, allowed: true, tokens: 0, reset: 10 },
      { at: 100_000, cost: 1, allowed: true, tokens: 9 },
    ],
  },
  {
    name: 'fractional tokens are kept: 3.4 + 0.8 s x 20/s = 19.4',
    capacity: 20,
    refillPerSecond: 20,
    steps: [
      { at: 0, cost: 20, allowed: true, tokens: 0 },
      { at: 220, cost: 1, allowed: true, tokens: 3.4 },
      { at: 1020, cost: 1, peek: true, allowed: true, tokens: 19.4, reset: 1 },
    ],
  },
  {
    name: 'a denial leaves the tokens unchanged and says when the cost is there',
    capacity: 5,
    refillPerSecond: 1,
    steps: [
      { at: 0, cost: 4, allowed: true, tokens: 1 },
      { at: 0, cost: 3, allowed: false, tokens: 1, retryAfter: 2 },
      { at: 500, cost: 3, allowed: false, tokens: 1.5, retryAfter: 2 },
      { at: 2000, cost: 3, allowed: true, tokens: 0, reset: 5 },
    ],
  },
  {
    name: 'Retry-After is never 0, even when the token is milliseconds away',
    capacity: 10,
    refillPerSecond: 100,
    steps: [
      { at: 0, cost: 10, allowed: true, tokens: 0 },
      { at: 5, cost: 1, allowed: false, tokens: 0.5, retryAfter: 1 },
    ],
  },
  {
    name: 'reset counts the seconds until the bucket is full',
    capacity: 100,
    refillPerSecond: 20,
    steps: [
      { at: 0, cost: 1, allowed: true, tokens: 99, reset: 1 },
      { at: 0, cost: 41, allowed: true, tokens: 58, reset: 3 },
    ],
  },
  {
    name: 'a clock that steps back (within the 1 s tolerance) neither refills nor lets the same time refill twice',
    capacity: 10,
    refillPerSecond: 1,
    steps: [
      { at: 5000, cost: 10, allowed: true, tokens: 0 },
      { at: 4000, cost: 1, allowed: false, tokens: 0, retryAfter: 1 },
      { at: 6000, cost: 1, allowed: true, tokens: 0 },
    ],
  },
  {
    name: 'a clock that steps back more than 1 s moves the stamp back to now, even on a refusal: the bucket refills from there',
    capacity: 10,
    refillPerSecond: 1,
    steps: [
      { at: 3_605_000, cost: 10, allowed: true, tokens: 0 },
      { at: 5000, cost: 1, allowed: false, tokens: 0, retryAfter: 1 },
      { at: 7000, cost: 1, allowed: true, tokens: 1 },
    ],
  },
  {
    name: 'the largest capacity (1e12) at the longest window (1e12 s) drains whole tokens exactly',
    capacity: 1e12,
    refillPerSecond: 1,
    steps: [
      { at: 0, cost: 1, allowed: true, tokens: 999_999_999_999, reset: 1 },
      { at: 0, cost: 1e12, allowed: false, tokens: 999_999_999_999, retryAfter: 1 },
      { at: 0, cost: 999_999_999_999, allowed: true, tokens: 0, reset: 1e12 },
      { at: 500, cost: 1, allowed: false, tokens: 0.5, retryAfter: 1 },
      { at: 2500, cost: 2, allowed: true, tokens: 0.5 },
    ],
  },
  {
    name: 'the slowest refill for one token (1e-12 per second) still gives integer headers',
    capacity: 1,
    refillPerSecond: 1e-12,
    steps: [
      { at: 0, cost: 1, allowed: true, tokens: 0, reset: 1e12 },
      { at: 1000, cost: 1, allowed: false, tokens: 1e-12 },
    ],
  },
  {
    name: 'the largest capacity with a huge refill (1e300 per second) is full again after a millisecond',
    capacity: 1e12,
    refillPerSecond: 1e300,
    steps: [
      // Its TTL is 1 ms of real time, so no step can count on the drained bucket still being there.
      { at: 0, cost: 1e12, allowed: true, tokens: 0, reset: 1 },
      { at: 1, cost: 1e12, allowed: true, tokens: 0, reset: 1 },
    ],
  },
  {
    name: 'a slow refill (5 per minute) grows by a twelfth of a token per second',
    capacity: 5,
    refillPerSecond: 5 / 60,
    steps: [
      { at: 0, cost: 5, allowed: true, tokens: 0 },
      { at: 6000, cost: 1, allowed: false, tokens: 0.5, retryAfter: 6 },
      { at: 12000, cost: 1, allowed: true, tokens: 0, reset: 60 },
    ],
  },
];

describe('token bucket arithmetic: Lua script and memory store agree', () => {
  const prefix = testPrefix('token-bucket');
  let client: Redis;
  let stores: [string, BucketStore][];

  beforeAll(async () => {
    client = new Redis(await redisUrl());
    stores = [
      ['lua', new RedisBucketStore(client, false)],
      ['memory', new MemoryBucketStore()],
    ];
  });

  afterAll(async () => {
    await deleteKeys(client, prefix);
    await client.quit();
  });

  describe.each(CASES.map((c) => [c.name, c] as const))('%s', (_name, testCase) => {
    it.each(['lua', 'memory'])('through the %s implementation', async (which) => {
      const store = stores.find(([name]) => name === which)![1];
      const key = `${prefix}{${which}:${CASES.indexOf(testCase)}}`;
      const seen: number[] = [];
      for (const step of testCase.steps) {
        const request = { key, capacity: testCase.capacity, refillPerSecond: testCase.refillPerSecond, cost: step.cost };
        const result = await store.take([request], { now: T0 + step.at, dryRun: step.peek });
        expect(result.allowed).toBe(step.allowed);
        expect(result.tokens[0]).toBeCloseTo(step.tokens, 9);
        seen.push(result.tokens[0]);
        const decision = toDecision(request, result.tokens[0], step.cost, result.allowed);
        expect(decision.remaining).toBe(Math.floor(step.tokens + 1e-9));
        for (const value of [decision.remaining, decision.retryAfterSeconds, decision.resetSeconds]) {
          expect(Number.isSafeInteger(value) && value >= 0).toBe(true);
        }
        if (step.retryAfter !== undefined) expect(decision.retryAfterSeconds).toBe(step.retryAfter);
        if (step.reset !== undefined) expect(decision.resetSeconds).toBe(step.reset);
      }
      (testCase as Case & { seen?: Record<string, number[]> }).seen ??= {};
      (testCase as Case & { seen: Record<string, number[]> }).seen[which] = seen;
    });

    it('gives bit-identical token counts in both implementations', () => {
      const seen = (testCase as Case & { seen?: Record<string, number[]> }).seen;
      expect(seen?.lua).toHaveLength(testCase.steps.length);
      expect(seen?.lua).toEqual(seen?.memory);
    });
  });

  it('expires an idle Redis bucket after twice the time it takes to fill (PEXPIRE ceil(2B/R) s)', async () => {
    const store = new RedisBucketStore(client, false);
    const key = `${prefix}{ttl}`;
    await store.take([{ key, capacity: 100, refillPerSecond: 20, cost: 1 }]);
    const ttl = await client.pttl(key);
    expect(ttl).toBeGreaterThan(9_000);
    expect(ttl).toBeLessThanOrEqual(10_000);
  });

  it('stores tokens with full precision: 200 refills of a third of a token stay bit-identical to the memory store', async () => {
    const store = new RedisBucketStore(client, false);
    const memory = new MemoryBucketStore();
    const key = `${prefix}{precision}`;
    const request = { key, capacity: 1000, refillPerSecond: 3, cost: 1 };
    // 1/3 of a token per 111 ms tick: tokens never land on a short decimal.
    await store.take([{ ...request, cost: 1000 }], { now: T0 });
    memory.takeSync([{ ...request, cost: 1000 }], { now: T0 });
    for (let i = 1; i <= 200; i++) {
      const at = T0 + i * 111;
      const lua = await store.take([{ ...request, cost: 0 }], { now: at });
      const mem = memory.takeSync([{ ...request, cost: 0 }], { now: at });
      expect(lua.tokens[0]).toBe(mem.tokens[0]);
    }
    const final = await store.take([request], { now: T0 + 200 * 111, dryRun: true });
    expect(final.tokens[0]).toBeCloseTo((200 * 111 * 3) / 1000, 9);
  });
});
