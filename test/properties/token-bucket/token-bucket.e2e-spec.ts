import { Redis } from 'ioredis';
import { MemoryBucketStore, RedisBucketStore } from 'nest-redis-rate-limit';
import type { BucketStore, TakeResult } from 'nest-redis-rate-limit';
import { type PenaltyReport, toDecision } from '../../../libs/rate-limit/src/stores/token-bucket.js';
import { deleteKeys, redisUrl, testPrefix } from '../../support/redis.js';
import { reportedTokens } from '../../../libs/rate-limit/src/stores/redis/lua/script-codec.js';

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
  /** How long the bucket's penalty still runs after this step (the store's report), in ms. */
  penaltyMs?: number;
}
interface Case {
  name: string;
  capacity: number;
  refillPerSecond: number;
  /** Penalty of the policy (`blockSeconds`); absent: none. */
  blockSeconds?: number;
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
  {
    name: 'penalty: a refusal leaves cost - b*R tokens, so the cost is back exactly b s later, and refusals meanwhile do not extend it',
    capacity: 2,
    refillPerSecond: 1,
    blockSeconds: 30,
    steps: [
      { at: 0, cost: 1, allowed: true, tokens: 1, penaltyMs: 0 },
      { at: 0, cost: 1, allowed: true, tokens: 0, penaltyMs: 0 },
      { at: 0, cost: 1, allowed: false, tokens: -29, retryAfter: 30, reset: 31, penaltyMs: 30_000 },
      // Still refused, counting down: the stored bucket is not touched (the idle TTL of 4 s would
      // have dropped it here: the TTL covers the penalty).
      { at: 10_000, cost: 1, allowed: false, tokens: -19, retryAfter: 20, reset: 21, penaltyMs: 20_000 },
      { at: 29_999, cost: 1, allowed: false, tokens: 0.999, retryAfter: 1, penaltyMs: 1 },
      { at: 30_000, cost: 1, allowed: true, tokens: 0, penaltyMs: 0 },
      // The penalty is over: the next refusal starts a new one.
      { at: 30_000, cost: 1, allowed: false, tokens: -29, retryAfter: 30, penaltyMs: 30_000 },
    ],
  },
  {
    name: 'penalty: a peek writes nothing (the later take starts the penalty)',
    capacity: 1,
    refillPerSecond: 1,
    blockSeconds: 10,
    steps: [
      { at: 0, cost: 1, allowed: true, tokens: 0 },
      { at: 0, cost: 1, peek: true, allowed: false, tokens: 0, penaltyMs: 0 },
      { at: 500, cost: 1, allowed: false, tokens: -9, retryAfter: 10, penaltyMs: 10_000 },
      { at: 10_499, cost: 1, peek: true, allowed: false, tokens: 0.999, penaltyMs: 1 },
      { at: 10_500, cost: 1, allowed: true, tokens: 0, penaltyMs: 0 },
    ],
  },
  {
    name: 'penalty shorter than the refill: tokens are never raised (min(t, cost - b*R)); a wait of at least b',
    capacity: 10,
    refillPerSecond: 1,
    blockSeconds: 0.5,
    steps: [
      { at: 0, cost: 10, allowed: true, tokens: 0 },
      { at: 1000, cost: 4, allowed: false, tokens: 1, retryAfter: 3, penaltyMs: 500 },
      { at: 1600, cost: 4, allowed: false, tokens: 1.6, retryAfter: 3, penaltyMs: 500 },
      { at: 4100, cost: 4, allowed: true, tokens: 0.1 },
    ],
  },
  {
    name: 'penalty with a fractional refill (1 per 4 s, 8 s): -1 token, the cost back at 8 s',
    capacity: 4,
    refillPerSecond: 0.25,
    blockSeconds: 8,
    steps: [
      { at: 0, cost: 4, allowed: true, tokens: 0 },
      { at: 0, cost: 1, allowed: false, tokens: -1, retryAfter: 8, reset: 20, penaltyMs: 8000 },
      { at: 7999, cost: 1, allowed: false, tokens: 0.99975, retryAfter: 1, penaltyMs: 1 },
      { at: 8000, cost: 1, allowed: true, tokens: 0, reset: 16 },
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
        const request = {
          key,
          capacity: testCase.capacity,
          refillPerSecond: testCase.refillPerSecond,
          cost: step.cost,
          blockSeconds: testCase.blockSeconds,
        };
        const result: TakeResult & PenaltyReport = await store.take([request], { now: T0 + step.at, dryRun: step.peek });
        if (step.penaltyMs !== undefined) expect(result.penaltyMs).toEqual([step.penaltyMs]);
        expect(result.allowed).toBe(step.allowed);
        expect(result.tokens[0]).toBeCloseTo(step.tokens, 9);
        seen.push(result.tokens[0]);
        const decision = toDecision(request, result.tokens[0], step.cost, result.allowed);
        expect(decision.remaining).toBe(Math.max(0, Math.floor(step.tokens + 1e-9)));
        for (const value of [decision.remaining, decision.retryAfterSeconds, decision.resetSeconds]) {
          expect(Number.isSafeInteger(value) && value >= 0).toBe(true);
        }
        if (step.retryAfter !== undefined) expect(decision.retryAfterSeconds).toBe(step.retryAfter);
        if (step.reset !== undefined) expect(decision.resetSeconds).toBe(step.reset);
      }
      (testCase as Case & { seen?: Record<string, number[]> }).seen ??= {};
      (testCase as Case & { seen: Record<string, number[]> }).seen[which] = seen;
    });

    it("gives the memory store's token counts, rounded down to the 45 bits the script's reply carries", () => {
      const seen = (testCase as Case & { seen?: Record<string, number[]> }).seen;
      expect(seen?.lua).toHaveLength(testCase.steps.length);
      expect(seen?.lua).toEqual(seen?.memory?.map(reportedTokens));
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
      // What Redis holds is the memory store's double, bit for bit; the reply carries it to 45 bits.
      expect(Number(await client.hget(key, 'tokens'))).toBe(mem.tokens[0]);
      expect(lua.tokens[0]).toBe(reportedTokens(mem.tokens[0]));
    }
    const final = await store.take([request], { now: T0 + 200 * 111, dryRun: true });
    expect(final.tokens[0]).toBeCloseTo((200 * 111 * 3) / 1000, 9);
  });
});

describe('penalties (blockSeconds) in Redis and in memory', () => {
  const prefix = testPrefix('token-bucket-penalties');
  let client: Redis;
  let lua: RedisBucketStore;
  let n = 0;
  const key = (name: string) => `${prefix}{${name}:${n++}}`;
  const POLICY = { capacity: 2, refillPerSecond: 1, blockSeconds: 30 };

  beforeAll(async () => {
    client = new Redis(await redisUrl());
    lua = new RedisBucketStore(client, false);
  });

  afterAll(async () => {
    await deleteKeys(client, prefix);
    await client.quit();
  });

  /** The stored hash; fails when the key does not exist (a missing key would read as a full bucket). */
  async function stored(k: string): Promise<Record<string, string>> {
    expect(await client.exists(k)).toBe(1);
    return client.hgetall(k);
  }

  it('a refusal writes tokens cost - b*R, the penalty end b, and a TTL that covers the refill from there', async () => {
    const k = key('refused');
    const request = { key: k, ...POLICY, cost: 1 };
    await lua.take([{ ...request, cost: 2 }], { now: T0 });
    expect(await stored(k)).toEqual({ tokens: '0', ts: String(T0) });
    // Without a penalty the idle TTL is 2·B/R = 4 s; the bucket refills from -29 in 31 s.
    expect(await lua.take([request], { now: T0 })).toEqual({ allowed: false, tokens: [-29], penaltyMs: [30_000] });
    expect(await stored(k)).toEqual({ tokens: '-29', ts: String(T0), b: String(T0 + 30_000) });
    const ttl = await client.pttl(k);
    expect(ttl).toBeGreaterThan(30_000);
    expect(ttl).toBeLessThanOrEqual(31_000);
  });

  it('a refusal during the penalty writes nothing (not extended); a retry at its end is allowed', async () => {
    const k = key('retry');
    const request = { key: k, ...POLICY, cost: 1 };
    await lua.take([{ ...request, cost: 2 }], { now: T0 + 1_000 });
    await lua.take([request], { now: T0 + 1_000 });
    const penalised = await stored(k);
    expect(penalised).toEqual({ tokens: '-29', ts: String(T0 + 1_000), b: String(T0 + 31_000) });
    const ttl = await client.pttl(k);
    for (const at of [1_001, 15_000, 30_999]) {
      const result = await lua.take([request], { now: T0 + at });
      expect(result.allowed).toBe(false);
      expect(result.penaltyMs).toEqual([31_000 - at]);
      expect(toDecision(request, result.tokens[0], 1, false).retryAfterSeconds).toBe(Math.ceil((31_000 - at) / 1000));
      expect(await stored(k)).toEqual(penalised);
    }
    // No write: the TTL was not set again (it only ran down).
    expect(await client.pttl(k)).toBeLessThanOrEqual(ttl);
    expect(await lua.take([request], { now: T0 + 31_000 })).toEqual({ allowed: true, tokens: [0], penaltyMs: [0] });
    // The stale end is left in place: harmless, it is in the past.
    expect(await stored(k)).toEqual({ tokens: '0', ts: String(T0 + 31_000), b: String(T0 + 31_000) });
  });

  it('a peek writes nothing, and a refund ignores the penalty (gives the cost back, keeps the end)', async () => {
    const k = key('peek');
    const request = { key: k, ...POLICY, cost: 1 };
    await lua.take([{ ...request, cost: 2 }], { now: T0 });
    expect(await lua.take([request], { now: T0, dryRun: true })).toEqual({ allowed: false, tokens: [0], penaltyMs: [0] });
    expect(await stored(k)).toEqual({ tokens: '0', ts: String(T0) });
    await lua.take([request], { now: T0 });
    expect(await lua.take([request], { now: T0 + 5_000, dryRun: true })).toEqual({ allowed: false, tokens: [-24], penaltyMs: [25_000] });
    expect(await lua.take([request], { now: T0 + 5_000, refund: true })).toEqual({ allowed: true, tokens: [-23], penaltyMs: [25_000] });
    expect(await stored(k)).toEqual({ tokens: '-23', ts: String(T0 + 5_000), b: String(T0 + 30_000) });
  });

  it.each(['lua', 'memory'])('two buckets, one short: only that one is penalised, nothing taken from the other (%s)', async (which) => {
    const store: BucketStore = which === 'lua' ? lua : new MemoryBucketStore();
    const roomy = { key: key('roomy'), capacity: 5, refillPerSecond: 1, blockSeconds: 10, cost: 1 };
    const short = { key: key('short'), capacity: 1, refillPerSecond: 1, blockSeconds: 10, cost: 1 };
    await store.take([roomy], { now: T0 });
    await store.take([short], { now: T0 });
    expect(await store.take([roomy, short], { now: T0 })).toEqual({ allowed: false, tokens: [4, -9], penaltyMs: [0, 10_000] });
    expect(await store.take([roomy], { now: T0, dryRun: true })).toEqual({ allowed: true, tokens: [4], penaltyMs: [0] });
    if (which === 'lua') {
      expect(await stored(roomy.key)).toEqual({ tokens: '4', ts: String(T0) });
      expect(await stored(short.key)).toEqual({ tokens: '-9', ts: String(T0), b: String(T0 + 10_000) });
    }
  });

  it('a call without penalties reads no penalty field and replies as before (3 arguments per bucket)', async () => {
    const k = key('plain');
    expect(await lua.take([{ key: k, capacity: 2, refillPerSecond: 1, cost: 2 }], { now: T0 })).toEqual({ allowed: true, tokens: [0] });
    expect(await lua.take([{ key: k, capacity: 2, refillPerSecond: 1, cost: 1, blockSeconds: 0 }], { now: T0 })).toEqual({
      allowed: false,
      tokens: [0],
    });
    expect(await stored(k)).toEqual({ tokens: '0', ts: String(T0) });
  });

  it.each([
    ['negative', -1],
    ['not a number', Number.NaN],
    ['infinite', Infinity],
    ['above 1e12 s', 2e12],
    ['withholding more than 1e12 tokens', 2e6],
  ])('the script refuses a blockSeconds that is %s before writing anything', async (_name, blockSeconds) => {
    const good = key('good');
    const bad = key('bad');
    await expect(
      lua.take(
        [
          { key: good, capacity: 2, refillPerSecond: 1, cost: 1 },
          { key: bad, capacity: 2, refillPerSecond: 1e6, cost: 1, blockSeconds },
        ],
        { now: T0 },
      ),
    ).rejects.toThrow(/blockSeconds/);
    expect(await client.exists(good, bad)).toBe(0);
  });
});
