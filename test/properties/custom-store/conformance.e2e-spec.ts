import { Redis } from 'ioredis';
import { type BucketStore, MemoryBucketStore, RedisBucketStore, type TakeOptions, type TakeResult } from 'nest-redis-rate-limit';
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

  it('catches a store whose refund is not capped at capacity', async () => {
    await expect(verifyBucketStore(new UncappedRefundStore(), { runs: 200, seed: 21_003 })).rejects.toThrow(
      /^BucketStore conformance: tokens differ from the model: /,
    );
  });
});
