import { Redis } from 'ioredis';
import {
  type BucketStore,
  MemoryBucketStore,
  RedisBucketStore,
  type SlotAnswer,
  type SlotCallOptions,
  type SlotRelease,
  type SlotRequest,
  type SlotStore,
  type TakeOptions,
  type TakeResult,
} from 'nest-redis-rate-limit';
import { verifyBucketStore } from 'nest-redis-rate-limit/testing';
import type { BucketRequest } from '../../../libs/rate-limit/src/stores/token-bucket.js';
import { deleteKeys, redisUrl, testPrefix } from '../../support/redis.js';

/**
 * `verifyBucketStore` (nest-redis-rate-limit/testing), what a user runs on a store of their own: the
 * library's stores pass it through their public interface (test/properties/model runs them deeper, with their
 * stored state), and a store that breaks the contract is caught with the rule it broke.
 */

/** Drains each bucket on its own: not all-or-nothing when one of several lacks its cost. */
class PiecewiseStore implements BucketStore {
  readonly remote = false;
  private readonly inner = new MemoryBucketStore();

  async take(requests: readonly BucketRequest[], options: TakeOptions = {}): Promise<TakeResult> {
    const results = await Promise.all(requests.map((r) => this.inner.take([r], options)));
    return { allowed: results.every((r) => r.allowed), tokens: results.map((r) => r.tokens[0]) };
  }

  delete(keys: readonly string[]): Promise<void> {
    return this.inner.delete(keys);
  }
}

/** Refunds without the cap at capacity. */
class UncappedRefundStore implements BucketStore {
  readonly remote = false;
  private readonly inner = new MemoryBucketStore();

  async take(requests: readonly BucketRequest[], options: TakeOptions = {}): Promise<TakeResult> {
    if (!options.refund) return this.inner.take(requests, options);
    const before = await this.inner.take(requests, { ...options, dryRun: true });
    await this.inner.take(requests, options);
    return { allowed: true, tokens: before.tokens.map((t, i) => t + requests[i].cost) };
  }

  delete(keys: readonly string[]): Promise<void> {
    return this.inner.delete(keys);
  }
}

/** Drops the ended slots at every take (not only when it needs their room): inFlight counts fewer ended ones. */
class EagerSlots implements SlotStore {
  private readonly keys = new Map<string, Map<string, number>>();

  private live(key: string, now: number): Map<string, number> {
    const slots = new Map([...(this.keys.get(key) ?? [])].filter(([, end]) => end > now));
    this.keys.set(key, slots);
    return slots;
  }

  takeSlot = async ({ key, limit, holder, leaseMs }: SlotRequest, options?: SlotCallOptions): Promise<SlotAnswer> => {
    const now = options?.now ?? Date.now();
    const slots = this.live(key, now);
    if (!slots.has(holder) && slots.size >= limit) return { held: false, inFlight: slots.size, waitMs: Math.min(...slots.values()) - now };
    slots.set(holder, now + leaseMs);
    return { held: true, inFlight: slots.size, waitMs: 0 };
  };

  giveBackSlot = async (key: string, holder: string): Promise<SlotRelease> => {
    const slots = this.keys.get(key) ?? new Map<string, number>();
    const released = slots.delete(holder);
    return { released, inFlight: slots.size };
  };
}

describe('verifyBucketStore: the BucketStore conformance suite', () => {
  const prefix = testPrefix('conformance');
  let client: Redis;

  beforeAll(async () => {
    client = new Redis(await redisUrl(), { enableOfflineQueue: false, lazyConnect: true });
    await client.connect();
  });

  afterAll(async () => {
    await deleteKeys(client, prefix);
    await client.quit();
  });

  it('passes the memory store over 100 sequences', async () => {
    await expect(verifyBucketStore(new MemoryBucketStore(), { runs: 100, seed: 21_003 })).resolves.toBeUndefined();
  });

  it('passes the Redis store (the Lua script on a real Redis) over 100 sequences, leaving no key behind', async () => {
    const keyPrefix = `${prefix}redis:`;
    await expect(verifyBucketStore(new RedisBucketStore(client, false), { runs: 100, seed: 21_003, keyPrefix })).resolves.toBeUndefined();
    expect(await client.keys(`${keyPrefix}*`)).toEqual([]);
  });

  it('catches a store that drains the buckets of a call one by one (not all-or-nothing)', async () => {
    await expect(verifyBucketStore(new PiecewiseStore(), { runs: 200, seed: 21_003 })).rejects.toThrow(
      /^BucketStore conformance: (allowed|tokens) differ(s)? from the model: /,
    );
  });

  it('with priorities: true, passes both stores and catches a store that ignores the floor (issue 36)', async () => {
    const keyPrefix = `${prefix}floors:`;
    await expect(verifyBucketStore(new MemoryBucketStore(), { runs: 100, seed: 36_002, priorities: true })).resolves.toBeUndefined();
    await expect(
      verifyBucketStore(new RedisBucketStore(client, false), { runs: 100, seed: 36_002, priorities: true, keyPrefix }),
    ).resolves.toBeUndefined();
    const inner = new MemoryBucketStore();
    const floorBlind: BucketStore = {
      remote: false,
      take: (requests, options) =>
        inner.take(
          requests.map(({ floor: _floor, ...request }) => request),
          options,
        ),
      delete: (keys) => inner.delete(keys),
    };
    // Without priorities the same store passes: the floors are what it is checked on.
    await expect(verifyBucketStore(floorBlind, { runs: 100, seed: 36_002 })).resolves.toBeUndefined();
    await expect(verifyBucketStore(floorBlind, { runs: 100, seed: 36_002, priorities: true })).rejects.toThrow(
      /^BucketStore conformance: (allowed differs from the model|a take was admitted below its floor): /,
    );
  });

  it('with slots: true, passes both stores and catches slots beyond the limit or a give-back of another holder (issue 36)', async () => {
    const keyPrefix = `${prefix}slots:`;
    // The buckets are checked too (each run draws as many sequences of both): fewer runs than above.
    await expect(verifyBucketStore(new MemoryBucketStore(), { runs: 50, seed: 36_005, slots: true })).resolves.toBeUndefined();
    await expect(
      verifyBucketStore(new RedisBucketStore(client, false), { runs: 50, seed: 36_005, slots: true, keyPrefix }),
    ).resolves.toBeUndefined();
    expect(await client.keys(`${keyPrefix}*`)).toEqual([]);

    const inner = new MemoryBucketStore();
    const buckets = { remote: false, take: inner.take.bind(inner), delete: inner.delete.bind(inner) };
    // One slot more than the limit.
    const overLimit: BucketStore & SlotStore = {
      ...buckets,
      takeSlot: (request, options) => inner.takeSlot({ ...request, limit: request.limit + 1 }, options),
      giveBackSlot: (key, holder) => inner.giveBackSlot(key, holder),
    };
    await expect(verifyBucketStore(overLimit, { runs: 30, seed: 36_005, slots: true })).rejects.toThrow(
      /^BucketStore conformance: a slot take was held beyond the limit \(rule 1\): /,
    );
    // A give-back frees the key's first holder, whoever asks.
    const first = new Map<string, string[]>();
    const anyHolder: BucketStore & SlotStore = {
      ...buckets,
      takeSlot: async (request, options) => {
        const answer = await inner.takeSlot(request, options);
        const holders = first.get(request.key) ?? [];
        if (answer.held && !holders.includes(request.holder)) first.set(request.key, [...holders, request.holder]);
        return answer;
      },
      giveBackSlot: (key, holder) => {
        const holders = first.get(key) ?? [];
        const freed = holders.includes(holder) ? holders[0] : holder;
        first.set(
          key,
          holders.filter((h) => h !== freed),
        );
        return inner.giveBackSlot(key, freed);
      },
    };
    await expect(verifyBucketStore(anyHolder, { runs: 30, seed: 36_005, slots: true })).rejects.toThrow(
      /^BucketStore conformance: (a give-back did not free its holder's slot \(rule 3\)|a slot take was held beyond the limit \(rule 1\)): /,
    );
    // A store that drops ended slots at once (counts the live ones only) keeps the contract too.
    await expect(verifyBucketStore({ ...buckets, ...new EagerSlots() }, { runs: 30, seed: 36_005, slots: true })).resolves.toBeUndefined();
    // Without slots: true neither is checked on its slots; a store without them is refused with it.
    await expect(verifyBucketStore(overLimit, { runs: 10, seed: 36_005 })).resolves.toBeUndefined();
    await expect(verifyBucketStore(new UncappedRefundStore(), { slots: true })).rejects.toThrow(/has no takeSlot\(\) and giveBackSlot\(\)/);
  });

  it('with slots: true, checks takeWithSlot where a store has it, and catches one that drains for a refused slot or takes a slot for a refused take', async () => {
    const inner = new MemoryBucketStore();
    const slots: BucketStore & SlotStore = {
      remote: false,
      take: inner.take.bind(inner),
      delete: inner.delete.bind(inner),
      takeSlot: inner.takeSlot.bind(inner),
      giveBackSlot: inner.giveBackSlot.bind(inner),
    };
    // The library's own: one call (checked in the test above on Redis and memory), or a take then a slot.
    await expect(
      verifyBucketStore({ ...slots, takeWithSlot: inner.takeWithSlot.bind(inner) } as BucketStore & SlotStore, { runs: 5, slots: true }),
    ).resolves.toBeUndefined();
    // Takes, then asks for the slot, and keeps the tokens when it is refused.
    const drains: BucketStore & SlotStore = {
      ...slots,
      takeWithSlot: async (requests, slot, options) => {
        const taken = await inner.take(requests, options);
        if (!taken.allowed) return { ...taken, slot: undefined };
        const answer = await inner.takeSlot(slot, options);
        return { ...taken, allowed: answer.held, slot: answer };
      },
    };
    await expect(verifyBucketStore(drains, { runs: 5, slots: true })).rejects.toThrow(
      /^BucketStore conformance: takeWithSlot, rule 2 \(the slot is held by another\): /,
    );
    // Asks for the slot first, and keeps it when a bucket refuses.
    const grabs: BucketStore & SlotStore = {
      ...slots,
      takeWithSlot: async (requests, slot, options) => {
        const answer = await inner.takeSlot(slot, options);
        if (!answer.held) return { ...(await inner.take(requests, { ...options, dryRun: true })), allowed: false, slot: answer };
        const taken = await inner.take(requests, options);
        return { ...taken, slot: answer };
      },
    };
    await expect(verifyBucketStore(grabs, { runs: 5, slots: true })).rejects.toThrow(/^BucketStore conformance: takeWithSlot, rule 3/);
  });

  it('catches a store whose refund is not capped at capacity', async () => {
    await expect(verifyBucketStore(new UncappedRefundStore(), { runs: 200, seed: 21_003 })).rejects.toThrow(
      /^BucketStore conformance: tokens differ from the model: /,
    );
  });
});
