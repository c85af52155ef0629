import { Redis } from 'ioredis';
import { BucketService, RedisBucketStore } from 'nest-redis-rate-limit';
import { resolveOptions } from '../../../libs/rate-limit/src/rate-limit.options-resolver.js';
import { deleteKeys, redisUrl, testPrefix } from '../../support/redis.js';

/**
 * Bucket hashes written by hand (a bug, a migration, someone at redis-cli): the script repairs what it
 * cannot trust instead of deciding from it. Times are the script's test-only `now` argument.
 */
const T0 = 1_750_000_000_000;
const POLICY = { capacity: 5, refillPerSecond: 1 };
/** 2·B/R in ms: the TTL every written bucket gets. */
const TTL_MS = 10_000;

describe('corrupted bucket state in Redis', () => {
  const prefix = testPrefix('corrupted-state');
  let client: Redis;
  let store: RedisBucketStore;
  let n = 0;

  /** A bucket hash with exactly these fields and no TTL. */
  async function corrupted(fields: Record<string, string>): Promise<string> {
    const key = `${prefix}{bucket:${n++}}`;
    await client.hset(key, fields);
    return key;
  }

  beforeAll(async () => {
    client = new Redis(await redisUrl());
    store = new RedisBucketStore(client, false);
  });

  afterAll(async () => {
    await deleteKeys(client, prefix);
    await client.quit();
  });

  describe.each([
    ['tokens nan', { tokens: 'nan', ts: String(T0) }],
    ['tokens inf', { tokens: 'inf', ts: String(T0) }],
    ['tokens -inf', { tokens: '-inf', ts: String(T0) }],
    ['tokens garbage', { tokens: 'lots', ts: String(T0) }],
    ['ts nan', { tokens: '0', ts: 'nan' }],
    ['ts inf', { tokens: '0', ts: 'inf' }],
    ['ts -inf', { tokens: '0', ts: '-inf' }],
    ['ts garbage', { tokens: '0', ts: 'yesterday' }],
    ['no ts', { tokens: '0' }],
  ])('%s counts as a missing key (a full bucket)', (_name, fields) => {
    it('takes from a full bucket and writes finite state with a TTL', async () => {
      const key = await corrupted(fields);
      const result = await store.take([{ key, ...POLICY, cost: 1 }], { now: T0 });
      expect(result).toEqual({ allowed: true, tokens: [4] });
      expect(await client.hgetall(key)).toEqual({ tokens: '4', ts: String(T0) });
      expect(await client.pttl(key)).toBeGreaterThan(TTL_MS - 1_000);
    });

    it('peeks a full bucket and writes nothing', async () => {
      const key = await corrupted(fields);
      const result = await store.take([{ key, ...POLICY, cost: 1 }], { now: T0, dryRun: true });
      expect(result).toEqual({ allowed: true, tokens: [5] });
      expect(await client.pttl(key)).toBe(-1);
    });
  });

  it('lets BucketService decide from the store, not count the bucket as a Redis failure (tokens=nan)', async () => {
    const key = await corrupted({ tokens: 'nan', ts: String(T0) });
    const name = key.slice(key.indexOf('{') + 1, key.indexOf('}'));
    const buckets = new BucketService(store, resolveOptions({ keyPrefix: prefix, failureMode: 'closed' }));
    const verdict = await buckets.decide([{ key, ...POLICY, cost: 2 }]);
    expect(verdict.source).toBe('store');
    expect(verdict.decisions[0]).toMatchObject({ allowed: true, remaining: 3 });
    expect(name).toMatch(/^bucket:/);
  });

  it('moves a stamp an hour in the future back to now, even on a refusal, so the bucket refills from now', async () => {
    const key = await corrupted({ tokens: '0', ts: String(T0 + 3_600_000) });
    const denied = await store.take([{ key, ...POLICY, cost: 1 }], { now: T0 });
    expect(denied).toEqual({ allowed: false, tokens: [0] });
    expect(await client.hget(key, 'ts')).toBe(String(T0));
    expect(await client.pttl(key)).toBeGreaterThan(TTL_MS - 1_000);
    const later = await store.take([{ key, ...POLICY, cost: 2 }], { now: T0 + 2_000 });
    expect(later).toEqual({ allowed: true, tokens: [0] });
  });

  it('keeps a stamp less than 1 s ahead (a small clock step back on Redis): no refill until then', async () => {
    const key = await corrupted({ tokens: '0', ts: String(T0 + 900) });
    expect(await store.take([{ key, ...POLICY, cost: 1 }], { now: T0 })).toEqual({ allowed: false, tokens: [0] });
    expect(await client.hget(key, 'ts')).toBe(String(T0 + 900));
    expect(await store.take([{ key, ...POLICY, cost: 1 }], { now: T0 + 1_900 })).toEqual({ allowed: true, tokens: [0] });
  });

  it('sets a TTL on a refused key that had none: an empty bucket without TTL does not live forever', async () => {
    const key = await corrupted({ tokens: '0', ts: String(T0) });
    expect(await store.take([{ key, ...POLICY, cost: 1 }], { now: T0 })).toEqual({ allowed: false, tokens: [0] });
    expect(await client.hgetall(key)).toEqual({ tokens: '0', ts: String(T0) });
    const ttl = await client.pttl(key);
    expect(ttl).toBeGreaterThan(TTL_MS - 1_000);
    expect(ttl).toBeLessThanOrEqual(TTL_MS);
  });

  it('leaves the TTL of a refused key that has one alone', async () => {
    const key = await corrupted({ tokens: '0', ts: String(T0) });
    await client.pexpire(key, 60_000);
    await store.take([{ key, ...POLICY, cost: 1 }], { now: T0 });
    expect(await client.pttl(key)).toBeGreaterThan(TTL_MS);
  });

  it('counts negative tokens as an empty bucket (never below 0), refilling from there', async () => {
    const key = await corrupted({ tokens: '-1e300', ts: String(T0) });
    expect(await store.take([{ key, ...POLICY, cost: 1 }], { now: T0 + 1_000 })).toEqual({ allowed: true, tokens: [0] });
  });

  describe('with a penalty (blockSeconds 30 at 1 token/s: tokens down to -30 are legal)', () => {
    const PENALISED = { ...POLICY, blockSeconds: 30 };

    it('keeps tokens a penalty can leave as they are: -29 refills to -28 after 1 s, nothing written', async () => {
      const fields = { tokens: '-29', ts: String(T0), b: String(T0 + 30_000) };
      const key = await corrupted(fields);
      await client.pexpire(key, 60_000);
      expect(await store.take([{ key, ...PENALISED, cost: 1 }], { now: T0 + 1_000 })).toEqual({
        allowed: false,
        tokens: [-28],
        penaltyMs: [29_000],
      });
      expect(await client.hgetall(key)).toEqual(fields);
      expect(await store.take([{ key, ...PENALISED, cost: 1 }], { now: T0 + 1_000, dryRun: true })).toMatchObject({ tokens: [-28] });
    });

    it('keeps the lowest legal tokens (-30) too', async () => {
      const key = await corrupted({ tokens: '-30', ts: String(T0), b: String(T0 + 30_000) });
      expect(await store.take([{ key, ...PENALISED, cost: 1 }], { now: T0 + 1_000, dryRun: true })).toMatchObject({ tokens: [-29] });
    });

    it.each(['-30.5', '-1e300'])('repairs tokens below what a penalty can leave (%s) to 0, refilling from there', async (tokens) => {
      const key = await corrupted({ tokens, ts: String(T0) });
      expect(await store.take([{ key, ...PENALISED, cost: 1 }], { now: T0 + 1_000 })).toEqual({
        allowed: true,
        tokens: [0],
        penaltyMs: [0],
      });
      expect(await client.hgetall(key)).toEqual({ tokens: '0', ts: String(T0 + 1_000) });
      expect(await client.pttl(key)).toBeGreaterThan(TTL_MS - 1_000);
    });

    it('counts -inf tokens as a missing key (a full bucket) and a penalty end that is not a number as none', async () => {
      const key = await corrupted({ tokens: '-inf', ts: String(T0), b: 'soon' });
      expect(await store.take([{ key, ...PENALISED, cost: 1 }], { now: T0 })).toEqual({ allowed: true, tokens: [4], penaltyMs: [0] });
      const other = await corrupted({ tokens: '0', ts: String(T0), b: 'nan' });
      expect(await store.take([{ key: other, ...PENALISED, cost: 1 }], { now: T0 })).toEqual({
        allowed: false,
        tokens: [-29],
        penaltyMs: [30_000],
      });
      expect(await client.hgetall(other)).toEqual({ tokens: '-29', ts: String(T0), b: String(T0 + 30_000) });
    });

    it('a policy without a penalty honours it while it runs (issue 22), and repairs negative tokens to 0 once it ended', async () => {
      const fields = { tokens: '-29', ts: String(T0), b: String(T0 + 30_000) };
      const key = await corrupted(fields);
      // Refused, told the penalty's remaining 29 s at its own refill (1 - 29 = -28), nothing written.
      expect(await store.take([{ key, ...POLICY, cost: 1 }], { now: T0 + 1_000 })).toEqual({ allowed: false, tokens: [-28] });
      expect(await client.hgetall(key)).toEqual(fields);
      const ended = await corrupted({ tokens: '-29', ts: String(T0), b: String(T0 + 1_000) });
      expect(await store.take([{ key: ended, ...POLICY, cost: 1 }], { now: T0 + 1_000 })).toEqual({ allowed: true, tokens: [0] });
    });
  });

  it('repairs every bucket of a multi-bucket refusal, and drains none of them', async () => {
    const frozen = await corrupted({ tokens: '-inf', ts: String(T0) });
    const future = await corrupted({ tokens: '0', ts: String(T0 + 3_600_000) });
    const denied = await store.take(
      [
        { key: frozen, ...POLICY, cost: 1 },
        { key: future, ...POLICY, cost: 1 },
      ],
      { now: T0 },
    );
    expect(denied).toEqual({ allowed: false, tokens: [5, 0] });
    expect(await client.hgetall(frozen)).toEqual({ tokens: '5', ts: String(T0) });
    expect(await client.hgetall(future)).toEqual({ tokens: '0', ts: String(T0) });
    expect(await client.pttl(frozen)).toBeGreaterThan(0);
    expect(await client.pttl(future)).toBeGreaterThan(0);
  });

  it('repairs a future stamp against Redis TIME too (no now argument)', async () => {
    const { 0: seconds } = await client.time();
    const key = await corrupted({ tokens: '0', ts: String((Number(seconds) + 3_600) * 1000) });
    await store.take([{ key, ...POLICY, cost: 1 }]);
    const ts = Number(await client.hget(key, 'ts'));
    expect(ts).toBeLessThan((Number(seconds) + 10) * 1000);
    expect(await client.pttl(key)).toBeGreaterThan(0);
  });
});
