import { Redis } from 'ioredis';
import { BucketService, MemoryBucketStore, RedisBucketStore } from 'nest-redis-rate-limit';
import type { BucketRequest } from '../../../libs/rate-limit/src/stores/token-bucket.js';
import { resolveOptions } from '../../../libs/rate-limit/src/rate-limit.options-resolver.js';
import { MAX_DECISIONS_PER_CALL } from '../../../libs/rate-limit/src/stores/redis/coalescer.js';
import { reportedTokens } from '../../../libs/rate-limit/src/stores/redis/lua/script-codec.js';
import { commandCalls, RedisServer, testPrefix } from '../../support/redis.js';

/**
 * Coalescing (`coalesce`, on by default): decisions that arrive in the same event-loop turn share one
 * script call, each decided on its own and in order. Runs on a Redis of its own, so that INFO
 * commandstats counts only this file's calls.
 */

const T0 = 1_800_000_000_000;

/** Deterministic doubles over many magnitudes (a small LCG: the same values on every run). */
function doubles(count: number, seed: number): number[] {
  let state = seed;
  const next = () => (state = (state * 1_103_515_245 + 12_345) % 2 ** 31) / 2 ** 31;
  return Array.from({ length: count }, () => next() * 10 ** Math.floor(next() * 24 - 12));
}

describe('the script and its numbers on this Redis', () => {
  const prefix = testPrefix('script-numbers');
  let server: RedisServer;
  let client: Redis;

  beforeAll(async () => {
    server = await RedisServer.start();
    client = new Redis(server.url);
  });

  afterAll(async () => {
    client?.disconnect();
    await server?.stop();
  });

  it('turns a Lua number given to redis.call into a string that reads back as the same double', async () => {
    const values = [
      0.1,
      1 / 3,
      (2 / 3) * 1e12,
      1e-300,
      5e-324,
      -29,
      2 ** 53 - 1,
      T0 + 0.25,
      1e12 - 1e-4,
      999_999_999.999,
      ...doubles(300, 7),
    ];
    const key = `${prefix}{lua-numbers}`;
    // HSET of tonumber(ARGV[i]): the script writes numbers, as the token-bucket script does.
    await client.eval(
      "for i = 1, #ARGV do redis.call('HSET', KEYS[1], 'f' .. i, tonumber(ARGV[i])) end return 1",
      1,
      key,
      ...values.map(String),
    );
    const stored = await client.hgetall(key);
    values.forEach((value, i) => expect(Number(stored[`f${i + 1}`])).toBe(value));
  });

  it('replies tokens to 45 bits, never more than the bucket holds, through the one-bucket path and the array path', async () => {
    const store = new RedisBucketStore(client, false);
    const capacity = 1e12;
    // Whole tokens (the script's shortcut: mantissa = tokens, exponent 45) up to the 1e12 bound, then fractions.
    const whole = [0, 1, 2, 99, 2 ** 39 + 1, 123_456_789_012, 1e12 - 1, 1e12];
    for (const [i, tokens] of [...whole, 0.3, 3.4, 999_999_999_999.5, 2 ** -70, ...doubles(200, 11)].entries()) {
      const key = `${prefix}{code:${i}}`;
      await client.hset(key, 'tokens', String(tokens), 'ts', String(T0));
      const one = await store.take([{ key, capacity, refillPerSecond: 1, cost: 0 }], { now: T0, dryRun: true });
      // With a penalty the array path answers, and tokens below 0 are legal state.
      const negative = -tokens;
      await client.hset(key, 'tokens', String(negative), 'ts', String(T0));
      const many = await store.take([{ key, capacity, refillPerSecond: 1, cost: 0, blockSeconds: 1e12 }], { now: T0, dryRun: true });
      for (const [held, reported] of [
        [tokens, one.tokens[0]],
        [negative, many.tokens[0]],
      ]) {
        expect(reported).toBe(reportedTokens(held));
        expect(reported).toBeLessThanOrEqual(held);
        expect(held - reported).toBeLessThanOrEqual(Math.abs(held) * 2 ** -44 + 2 ** -105);
      }
    }
  });
});

describe('decisions of one event-loop turn share one script call', () => {
  const prefix = testPrefix('coalescing');
  let server: RedisServer;
  let client: Redis;
  let n = 0;
  const key = (name: string) => `${prefix}{${name}:${n++}}`;
  const calls = async () => (await commandCalls(client, 'evalsha')) + (await commandCalls(client, 'eval'));

  beforeAll(async () => {
    server = await RedisServer.start();
    client = new Redis(server.url);
    // Load the scripts (decide, reserve, give-back), so that the counts below see EVALSHA only.
    const warm = new RedisBucketStore(client, false);
    const request = { key: key('warm'), capacity: 1, refillPerSecond: 1, cost: 0 };
    await warm.take([request]);
    const reserved = await warm.take([request], { reserve: { maxWaitMs: 0, boundMs: 0 } });
    await warm.take([request], { refund: true, givesBack: { tokens: reserved.tokens[0], nowMs: reserved.nowMs! } });
  });

  afterAll(async () => {
    client?.disconnect();
    await server?.stop();
  });

  async function counted<T>(action: () => Promise<T>): Promise<{ result: T; calls: number }> {
    const before = await calls();
    const result = await action();
    return { result, calls: (await calls()) - before };
  }

  it('sends 20 simultaneous takes of one bucket in two calls (the first alone, at once) and allows exactly its capacity', async () => {
    const store = new RedisBucketStore(client, false);
    const bucket = { key: key('hot'), capacity: 7, refillPerSecond: 1e-6, cost: 1 };
    const { result, calls: sent } = await counted(() => Promise.all(Array.from({ length: 20 }, () => store.take([bucket]))));
    expect(result.filter((r) => r.allowed)).toHaveLength(7);
    // In order: the first 7 decisions of the turn were allowed, each leaving one token less.
    expect(result.map((r) => r.allowed)).toEqual([...new Array(7).fill(true), ...new Array(13).fill(false)]);
    result.slice(0, 7).forEach((r, i) => expect(r.tokens[0]).toBeCloseTo(6 - i, 3));
    expect(sent).toBe(2);
  });

  it('sends one call per decision with coalesce: false', async () => {
    const store = new RedisBucketStore(client, false, false);
    const bucket = { key: key('plain'), capacity: 7, refillPerSecond: 1e-6, cost: 1 };
    const { result, calls: sent } = await counted(() => Promise.all(Array.from({ length: 20 }, () => store.take([bucket]))));
    expect(result.filter((r) => r.allowed)).toHaveLength(7);
    expect(sent).toBe(20);
  });

  it(`splits a turn of more than ${MAX_DECISIONS_PER_CALL} decisions into calls of at most that many`, async () => {
    const store = new RedisBucketStore(client, false);
    const count = 2 * MAX_DECISIONS_PER_CALL + 1;
    const { result, calls: sent } = await counted(() =>
      Promise.all(
        Array.from({ length: count }, (_, i) => store.take([{ key: key(`wide-${i}`), capacity: 5, refillPerSecond: 1, cost: 1 }])),
      ),
    );
    expect(result.every((r) => r.allowed && r.tokens[0] === 4)).toBe(true);
    // The first alone, then 2 * MAX in two calls.
    expect(sent).toBe(3);
  });

  it('decides each decision of a shared call as if it were alone: modes, several buckets, penalties, refusals', async () => {
    const store = new RedisBucketStore(client, false);
    const memory = new MemoryBucketStore();
    const slow = { capacity: 3, refillPerSecond: 1e-6 };
    const a = key('a');
    const b = key('b');
    const p = key('p');
    const steps: { requests: BucketRequest[]; options?: { dryRun?: boolean; refund?: boolean } }[] = [
      { requests: [{ key: a, ...slow, cost: 2 }] },
      {
        requests: [
          { key: a, ...slow, cost: 1 },
          { key: b, ...slow, cost: 3 },
        ],
      },
      { requests: [{ key: a, ...slow, cost: 1 }] },
      { requests: [{ key: a, ...slow, cost: 1 }], options: { dryRun: true } },
      { requests: [{ key: a, ...slow, cost: 2 }], options: { refund: true } },
      { requests: [{ key: p, ...slow, cost: 4, blockSeconds: 10 }] },
      { requests: [{ key: p, ...slow, cost: 1, blockSeconds: 10 }] },
      {
        requests: [
          { key: a, ...slow, cost: 3 },
          { key: b, ...slow, cost: 1 },
        ],
      },
    ];
    const { result: shared, calls: sent } = await counted(() => Promise.all(steps.map((s) => store.take(s.requests, s.options))));
    expect(sent).toBe(2);
    // The same steps, one after the other, in the memory store (the same arithmetic, tokens in full).
    for (const [i, step] of steps.entries()) {
      const alone = memory.takeSync(step.requests, { ...step.options, now: T0 });
      expect({ step: i, allowed: shared[i].allowed }).toEqual({ step: i, allowed: alone.allowed });
      shared[i].tokens.forEach((t, j) => expect(t).toBeCloseTo(alone.tokens[j], 3));
    }
    expect(shared[5].penaltyMs?.[0]).toBeGreaterThan(9_000);
  });

  it('shares a call among decisions in a row of one script, and decides a mixed turn in the order it came', async () => {
    const store = new RedisBucketStore(client, false);
    const bucket = { key: key('mixed'), capacity: 4, refillPerSecond: 10, cost: 1 };
    const reserve = { reserve: { maxWaitMs: 5_000, boundMs: 5_000 } };
    const { result, calls: sent } = await counted(() =>
      Promise.all([
        store.take([bucket]),
        store.take([bucket]),
        store.take([bucket]),
        store.take([bucket], reserve),
        store.take([bucket], reserve),
        store.take([bucket]),
        store.take([bucket]),
      ]),
    );
    // The first alone; then takes, reservations (one batch), takes: a call per run of one script.
    expect(sent).toBe(4);
    expect(result.map((r) => r.allowed)).toEqual([true, true, true, true, true, false, false]);
    // In order: the reservations found 1 token, then none (a turn 100 ms away), and the takes after them
    // found the reserved token gone (decided before the reservations, the first of them would have had it).
    expect(result[3].waitMs).toBe(0);
    expect(result[4].waitMs).toBeGreaterThan(90);
    expect(result[4].waitMs).toBeLessThanOrEqual(100);
    expect(result[5].tokens[0]).toBeLessThan(0);
  });

  it('refuses a decision with a number out of bounds alone: the others of its call are decided, and it writes nothing', async () => {
    const store = new RedisBucketStore(client, false);
    const good = key('good');
    const bad = key('bad');
    const outcomes = await Promise.allSettled([
      store.take([{ key: good, capacity: 5, refillPerSecond: 1e-6, cost: 1 }]),
      store.take([{ key: good, capacity: 5, refillPerSecond: 1e-6, cost: 1 }]),
      store.take([{ key: bad, capacity: 2.5, refillPerSecond: 1, cost: 1 }]),
      store.take([{ key: good, capacity: 5, refillPerSecond: 1e-6, cost: 1 }]),
    ]);
    expect(outcomes.map((o) => o.status)).toEqual(['fulfilled', 'fulfilled', 'rejected', 'fulfilled']);
    expect((outcomes[2] as PromiseRejectedResult).reason.message).toMatch(/token-bucket: bucket 1 .*capacity must be an integer/);
    expect((outcomes[3] as PromiseFulfilledResult<{ tokens: number[] }>).value.tokens[0]).toBeCloseTo(2, 3);
    expect(await client.exists(bad)).toBe(0);
  });

  it('BucketService: 30 simultaneous consumes of a burst of 10 allow exactly 10, in 2 calls (module default)', async () => {
    const buckets = new BucketService(new RedisBucketStore(client, false), resolveOptions({ keyPrefix: prefix, denyCache: false }));
    const id = `svc-${n++}`;
    const { result, calls: sent } = await counted(() =>
      Promise.all(Array.from({ length: 30 }, () => buckets.consume(id, { capacity: 10, refillPerSecond: 1e-6 }))),
    );
    expect(result.filter((d) => d.allowed)).toHaveLength(10);
    expect(sent).toBe(2);
  });
});

describe('a lone decision is not held back', () => {
  let server: RedisServer;
  let client: Redis;

  beforeAll(async () => {
    server = await RedisServer.start();
    client = new Redis(server.url);
    await client.ping();
  });

  afterAll(async () => {
    client?.disconnect();
    await server?.stop();
  });

  it('is written to the connection in the same tick it is asked for; the second of the turn waits for the turn to end', async () => {
    const store = new RedisBucketStore(client, false);
    const queue = () => (client as unknown as { commandQueue: { length: number } }).commandQueue.length;
    const bucket = { key: `${testPrefix('lone')}{k}`, capacity: 5, refillPerSecond: 1, cost: 1 };
    const first = store.take([bucket]);
    expect(queue()).toBe(1);
    const second = store.take([bucket]);
    expect(queue()).toBe(1);
    await new Promise((resolve) => setImmediate(resolve));
    expect((await first).allowed && (await second).allowed).toBe(true);
    await client.del(bucket.key);
  });
});
