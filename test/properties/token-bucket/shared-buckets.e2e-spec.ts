import { Redis } from 'ioredis';
import { MemoryBucketStore, RedisBucketStore } from 'nest-redis-rate-limit';
import type { BucketStore } from 'nest-redis-rate-limit';
import { type BucketRequest, toDecision } from '../../../libs/rate-limit/src/stores/token-bucket.js';
import { deleteKeys, redisUrl, testPrefix } from '../../support/redis.js';

/**
 * Issue 22, findings 2 and 6, at the level of the stores (the Lua script on the real Redis and the
 * memory store, with the test-only clock `now`):
 * - a penalty is sized by the policy's `penaltyCost` (its fixed cost, or 1 when the cost is computed
 *   per request), never by the refused request's cost;
 * - callers that share one bucket with different numbers (routes sharing a `name`) never shorten its
 *   TTL and honour a running penalty, whatever their own `blockSeconds`.
 */
const T0 = 1_750_000_000_000;

describe('shared buckets and penalties: Lua script and memory store', () => {
  const prefix = testPrefix('shared-buckets');
  let client: Redis;
  let n = 0;
  const stores: Record<string, () => BucketStore> = {};
  const key = (name: string) => `${prefix}{${name}:${n++}}`;

  beforeAll(async () => {
    client = new Redis(await redisUrl());
    const lua = new RedisBucketStore(client, false);
    stores.lua = () => lua;
    stores.memory = () => new MemoryBucketStore();
  });

  afterAll(async () => {
    await deleteKeys(client, prefix);
    await client.quit();
  });

  describe.each(['lua', 'memory'])('%s', (which) => {
    it('a refused request of cost 100 starts a penalty sized by penaltyCost 1, not by its own cost', async () => {
      const store = stores[which]();
      const k = key('cost');
      const policy = { key: k, capacity: 100, refillPerSecond: 10, blockSeconds: 5, penaltyCost: 1 };
      expect((await store.take([{ ...policy, cost: 95 }], { now: T0 })).tokens).toEqual([5]);
      // The floor is 1 - 5 s × 10/s = -49, whatever the refused cost (the floor 100 - 50 = 50 withheld nothing).
      const refused = await store.take([{ ...policy, cost: 100 }], { now: T0 });
      expect(refused).toEqual({ allowed: false, tokens: [-49], penaltyMs: [5_000] });
      const blocked = await store.take([{ ...policy, cost: 1 }], { now: T0 + 4_999 });
      expect(blocked.allowed).toBe(false);
      expect(toDecision(policy, blocked.tokens[0], 1, false).retryAfterSeconds).toBe(1);
      expect(await store.take([{ ...policy, cost: 1 }], { now: T0 + 5_000 })).toEqual({ allowed: true, tokens: [0], penaltyMs: [0] });
    });

    it('without penaltyCost the refused cost sizes the penalty, as for a fixed-cost policy (unchanged numbers)', async () => {
      const store = stores[which]();
      const k = key('fixed');
      const policy = { key: k, capacity: 10, refillPerSecond: 1, blockSeconds: 8, cost: 3 };
      await store.take([{ ...policy, cost: 9 }], { now: T0 });
      expect(await store.take([policy], { now: T0 })).toEqual({ allowed: false, tokens: [-5], penaltyMs: [8_000] });
      expect(await store.take([policy], { now: T0 + 8_000 })).toEqual({ allowed: true, tokens: [0], penaltyMs: [0] });
    });

    // Two routes sharing a name: a strict one (60 s penalty) and looser ones, in both orders.
    const strict: Omit<BucketRequest, 'key'> = { capacity: 2, refillPerSecond: 1, blockSeconds: 60, cost: 1 };
    const looser: Omit<BucketRequest, 'key'>[] = [
      { capacity: 10, refillPerSecond: 10, cost: 1 },
      { capacity: 2, refillPerSecond: 1, blockSeconds: 2, cost: 1 },
    ];

    it.each(looser.map((l) => [l.blockSeconds === undefined ? 'no blockSeconds' : `blockSeconds ${l.blockSeconds}`, l] as const))(
      'stricter first: a looser sibling (%s) honours the 60 s penalty until its end and does not clear it',
      async (_name, loose) => {
        const store = stores[which]();
        const k = key('strict-first');
        await store.take([{ key: k, ...strict, cost: 2 }], { now: T0 });
        expect(await store.take([{ key: k, ...strict }], { now: T0 })).toEqual({ allowed: false, tokens: [-59], penaltyMs: [60_000] });
        for (const at of [2_000, 30_000, 59_999]) {
          const result = await store.take([{ key: k, ...loose }], { now: T0 + at });
          expect(result.allowed).toBe(false);
          // Its Retry-After is the penalty's remaining time, at its own refill rate.
          expect(toDecision(loose, result.tokens[0], 1, false).retryAfterSeconds).toBe(Math.ceil((60_000 - at) / 1000));
          expect(toDecision(loose, result.tokens[0], 1, false).remaining).toBe(0);
          const mine = await store.take([{ key: k, ...strict }], { now: T0 + at });
          expect(mine.allowed).toBe(false);
          expect(toDecision(strict, mine.tokens[0], 1, false).retryAfterSeconds).toBe(Math.ceil((60_000 - at) / 1000));
        }
        expect((await store.take([{ key: k, ...strict }], { now: T0 + 60_000 })).allowed).toBe(true);
      },
    );

    it.each(looser.map((l) => [l.blockSeconds === undefined ? 'no blockSeconds' : `blockSeconds ${l.blockSeconds}`, l] as const))(
      'looser first: after a looser sibling (%s) drained the bucket, the strict penalty holds for both',
      async (_name, loose) => {
        const store = stores[which]();
        const k = key('loose-first');
        await store.take([{ key: k, ...loose, cost: loose.capacity }], { now: T0 });
        expect(await store.take([{ key: k, ...strict }], { now: T0 + 10 })).toMatchObject({ allowed: false, penaltyMs: [60_000] });
        for (const at of [2_010, 59_999]) {
          expect((await store.take([{ key: k, ...loose }], { now: T0 + at })).allowed).toBe(false);
          expect((await store.take([{ key: k, ...strict }], { now: T0 + at })).allowed).toBe(false);
        }
        expect((await store.take([{ key: k, ...loose }], { now: T0 + 60_010 })).allowed).toBe(true);
      },
    );

    it("a looser sibling does not shorten the strict bucket's life: drained at 3 per hour, it stays drained", async () => {
      const store = stores[which]();
      const k = key('ttl');
      const hourly = { key: k, capacity: 3, refillPerSecond: 3 / 3600, cost: 3 };
      // Its idle TTL is 2·B/R = 7200 s; the sibling's is 2·3/1.5 = 4 s.
      const sibling = { key: k, capacity: 3, refillPerSecond: 1.5, cost: 0 };
      expect((await store.take([hourly], { now: T0 })).allowed).toBe(true);
      expect((await store.take([sibling], { now: T0 })).allowed).toBe(true);
      if (which === 'lua') {
        expect(await client.pttl(k)).toBeGreaterThan(7_190_000);
      } else {
        // 5 s later, past the sibling's 4 s TTL: still drained (refilled 5 s × 1/1200 tokens), not a fresh bucket.
        const later = await store.take([{ ...hourly, cost: 1 }], { now: T0 + 5_000 });
        expect(later.allowed).toBe(false);
        expect(later.tokens[0]).toBeCloseTo(5 / 1200, 9);
      }
    });
  });

  it('looser first: the strict call lengthens the TTL, the looser one after it does not shorten it (Redis PTTL)', async () => {
    const lua = stores.lua();
    const k = key('ttl-order');
    await lua.take([{ key: k, capacity: 3, refillPerSecond: 1.5, cost: 1 }]);
    expect(await client.pttl(k)).toBeLessThanOrEqual(4_000);
    await lua.take([{ key: k, capacity: 3, refillPerSecond: 3 / 3600, cost: 1 }]);
    expect(await client.pttl(k)).toBeGreaterThan(7_190_000);
    await lua.take([{ key: k, capacity: 3, refillPerSecond: 1.5, cost: 0 }]);
    expect(await client.pttl(k)).toBeGreaterThan(7_190_000);
  });

  it('a bucket written by hand without a TTL gets one from an allowed take, and a new bucket gets one', async () => {
    const lua = stores.lua();
    const handmade = key('no-ttl');
    await client.hset(handmade, 'tokens', '2', 'ts', String(T0));
    expect(await client.pttl(handmade)).toBe(-1);
    expect((await lua.take([{ key: handmade, capacity: 2, refillPerSecond: 1, cost: 1 }], { now: T0 })).allowed).toBe(true);
    expect(await client.pttl(handmade)).toBeGreaterThan(3_000);
    const fresh = key('new');
    await lua.take([{ key: fresh, capacity: 2, refillPerSecond: 1, cost: 1, blockSeconds: 5 }], { now: T0 });
    expect(await client.pttl(fresh)).toBeGreaterThan(3_000);
  });
});
