import { Redis } from 'ioredis';
import { type BucketRequest, MemoryBucketStore, RedisBucketStore, type SlotRequest, type SlotTakeResult } from 'nest-redis-rate-limit';
import { reportedTokens } from '../../../libs/rate-limit/src/stores/redis/lua/script-codec.js';
import { deleteKeys, redisUrl, testPrefix } from '../../support/redis.js';

/**
 * A route's rate policies and its @ConcurrencyLimit decided in one atomic store call (issue 36, item 1:
 * take-with-slot.lua, and the memory store's `takeWithSlot`): the slot is asked for only when every
 * bucket has its cost, the buckets are drained only when the slot is held, a slot refused leaves them as
 * they were, and a rate refusal writes what a take's would (a penalty). Then the two stores against each
 * other over a random sequence, with the clock driven by the test.
 */
const T0 = 1_900_000_000_000;

describe('a take and a slot in one call', () => {
  const prefix = testPrefix('take-with-slot');
  let client: Redis;
  let redis: RedisBucketStore;
  let n = 0;

  beforeAll(async () => {
    client = new Redis(await redisUrl());
    redis = new RedisBucketStore(client, false, false);
  });
  afterAll(async () => {
    await deleteKeys(client, prefix);
    client.disconnect();
  });

  const stores = {
    redis: () => redis,
    memory: () => new MemoryBucketStore(),
  };

  describe.each(['redis', 'memory'] as const)('%s store', (name) => {
    let store: RedisBucketStore | MemoryBucketStore;
    let key: string;
    beforeEach(() => {
      store = stores[name]();
      key = `${prefix}${name}-${n++}`;
    });

    const bucket = (suffix: string, extra: Partial<BucketRequest> = {}): BucketRequest => ({
      key: `${key}{id}:${suffix}`,
      capacity: 5,
      refillPerSecond: 1,
      cost: 2,
      ...extra,
    });
    const slotOf = (holder: string, limit = 1): SlotRequest => ({ key: `${key}{id}!s`, limit, holder, leaseMs: 10_000 });
    /** What a peek says the buckets hold now. */
    const held = async (requests: BucketRequest[], now: number) => (await store.take(requests, { dryRun: true, now })).tokens;

    it('drains every bucket and holds the slot when all have their cost and a slot is free', async () => {
      const buckets = [bucket('a'), bucket('b', { capacity: 9, cost: 3 })];
      const result = await store.takeWithSlot(buckets, slotOf('h1', 2), { now: T0 });
      expect(result).toEqual({ allowed: true, tokens: [3, 6], slot: { held: true, inFlight: 1, waitMs: 0 } });
      expect(await held(buckets, T0)).toEqual([3, 6]);
      // The slot is the holder's: a second holder gets the other one of 2, a third none.
      expect((await store.takeSlot(slotOf('h2', 2), { now: T0 })).held).toBe(true);
      expect((await store.takeSlot(slotOf('h3', 2), { now: T0 })).held).toBe(false);
    });

    it('leaves the buckets as they were when the slot is refused, and says how long until a lease ends', async () => {
      const buckets = [bucket('a'), bucket('b')];
      await store.take(buckets, { now: T0 });
      expect((await store.takeSlot(slotOf('holder'), { now: T0 })).held).toBe(true);
      const raw = name === 'redis' ? await Promise.all(buckets.map((b) => client.hgetall(b.key))) : undefined;
      const result = await store.takeWithSlot(buckets, slotOf('late'), { now: T0 + 500 });
      // 3 left, plus half a second at 1/s: what they hold, not drained.
      expect(result).toEqual({ allowed: false, tokens: [3.5, 3.5], slot: { held: false, inFlight: 1, waitMs: 9_500 } });
      expect(await held(buckets, T0 + 500)).toEqual([3.5, 3.5]);
      if (raw !== undefined) expect(await Promise.all(buckets.map((b) => client.hgetall(b.key)))).toEqual(raw);
    });

    it('asks for no slot when a bucket lacks its cost, and starts its penalty as a take would', async () => {
      const buckets = [bucket('a'), bucket('b', { cost: 6, blockSeconds: 4 })];
      const result: SlotTakeResult = await store.takeWithSlot(buckets, slotOf('h'), { now: T0 });
      expect(result.allowed).toBe(false);
      expect(result.slot).toBeUndefined();
      expect(result.tokens[0]).toBe(5);
      expect(result.penaltyMs).toEqual([0, 4_000]);
      // The slot is free: nothing was taken.
      expect(await store.takeSlot(slotOf('other'), { now: T0 })).toEqual({ held: true, inFlight: 1, waitMs: 0 });
      if (name === 'redis') expect(await client.hget(buckets[1].key, 'b')).toBe(String(T0 + 4_000));
    });

    it('keeps a reserve: a take above a floor that would go below it asks for no slot', async () => {
      const buckets = [bucket('a', { floor: 4 })];
      const result = await store.takeWithSlot(buckets, slotOf('h'), { now: T0 });
      expect([result.allowed, result.slot, result.tokens]).toEqual([false, undefined, [5]]);
      const critical = await store.takeWithSlot([bucket('a')], slotOf('h'), { now: T0 });
      expect([critical.allowed, critical.tokens]).toEqual([true, [3]]);
    });
  });

  describe('refused arguments and keys (Redis)', () => {
    it('refuses a slot key that holds another type, and writes nothing to the buckets', async () => {
      const key = `${prefix}unusable-${n++}`;
      await client.set(`${key}{id}!s`, 'not a hash');
      const buckets: BucketRequest[] = [{ key: `${key}{id}:a`, capacity: 5, refillPerSecond: 1, cost: 1 }];
      await expect(redis.takeWithSlot(buckets, { key: `${key}{id}!s`, limit: 1, holder: 'h', leaseMs: 1_000 })).rejects.toMatchObject({
        code: 'ERR_RATE_LIMIT_UNUSABLE_KEY',
      });
      expect(await client.exists(buckets[0].key)).toBe(0);
    });

    it.each([
      ['a limit of 0', { limit: 0 }, /the limit must be an integer from 1 to 10000/],
      ['an empty holder', { holder: '' }, /the holder must be 1 to 128 characters/],
      ['a lease of 0 ms', { leaseMs: 0 }, /leaseMs must be an integer from 1 to 3600000/],
    ])('refuses %s before anything is written', async (_, wrong, message) => {
      const key = `${prefix}refused-${n++}`;
      const buckets: BucketRequest[] = [{ key: `${key}{id}:a`, capacity: 5, refillPerSecond: 1, cost: 1 }];
      const slot = { key: `${key}{id}!s`, limit: 1, holder: 'h', leaseMs: 1_000, ...wrong };
      await expect(redis.takeWithSlot(buckets, slot)).rejects.toThrow(message);
      await expect(new MemoryBucketStore().takeWithSlot(buckets, slot)).rejects.toThrow(message);
      expect(await client.exists(buckets[0].key, slot.key)).toBe(0);
    });
  });

  it('answers as the memory store does over a random sequence of takes, give-backs and time (seeded)', async () => {
    const seed = 20261206;
    let state = seed;
    const random = () => (state = (state * 1103515245 + 12345) % 2 ** 31) / 2 ** 31;
    const memory = new MemoryBucketStore();
    const key = `${prefix}sequence-${n++}`;
    const buckets = (cost: number, floor: number): BucketRequest[] => [
      { key: `${key}{id}:a`, capacity: 6, refillPerSecond: 4, cost, ...(floor > 0 ? { floor } : {}) },
      { key: `${key}{id}:b`, capacity: 10, refillPerSecond: 3, cost: 1, blockSeconds: 1 },
    ];
    const slotKey = `${key}{id}!s`;
    const holders: string[] = [];
    let now = T0;
    const outcomes = { usual: 0, drained: 0, slotRefused: 0, rateRefused: 0 };
    for (let step = 0; step < 400; step++) {
      now += Math.floor(random() * 400);
      const roll = random();
      if (roll < 0.35 && holders.length > 0) {
        const holder = holders.splice(Math.floor(random() * holders.length), 1)[0];
        const [a, b] = await Promise.all([redis.giveBackSlot(slotKey, holder), memory.giveBackSlot(slotKey, holder)]);
        expect({ step, ...a }).toEqual({ step, ...b });
        continue;
      }
      // Half of them one bucket without a penalty or a floor: the script's usual path; the others its general one.
      const both = buckets(1 + Math.floor(random() * 3), random() < 0.2 ? 2 : 0);
      const usual = random() < 0.5;
      const requests = usual ? [{ ...both[0], floor: undefined }] : both;
      const slot: SlotRequest = { key: slotKey, limit: 3, holder: `h${step}`, leaseMs: 1_500 };
      const [a, b] = await Promise.all([redis.takeWithSlot(requests, slot, { now }), memory.takeWithSlot(requests, slot, { now })]);
      // The script's wait is a bound from `e`, at most the memory store's exact one (SlotAnswer.waitMs).
      const waits = [a.slot?.waitMs, b.slot?.waitMs];
      expect(waits[0] ?? 0).toBeLessThanOrEqual(waits[1] ?? 0);
      const same = (r: SlotTakeResult) => ({ ...r, slot: r.slot && { ...r.slot, waitMs: r.slot.waitMs > 0 } });
      expect({ step, ...same(a) }).toEqual({ step, ...same({ ...b, tokens: b.tokens.map(reportedTokens) }) });
      if (a.slot?.held) holders.push(slot.holder);
      if (usual) outcomes.usual++;
      if (a.allowed) outcomes.drained++;
      else if (a.slot === undefined) outcomes.rateRefused++;
      else outcomes.slotRefused++;
    }
    // The sequence reached each outcome many times.
    expect(outcomes.usual).toBeGreaterThan(100);
    expect(outcomes.drained).toBeGreaterThan(20);
    expect(outcomes.slotRefused).toBeGreaterThan(20);
    expect(outcomes.rateRefused).toBeGreaterThan(20);
  });
});
