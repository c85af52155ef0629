import { Test, type TestingModule } from '@nestjs/testing';
import { BucketService, RateLimitConfigError, RateLimitModule } from 'nest-redis-rate-limit';
import { redisUrl } from '../../support/redis.js';
import { redisScenario } from '../../support/scenario.js';

/**
 * Issue 32, item 5: a bucket name is a non-empty string. `undefined`, `''` and `5` were taken as they
 * were (`undefined` became the bucket `{undefined}`, shared by every call that lost its name) and an
 * object threw a raw TypeError. Each method now refuses them with a coded error naming the method, and
 * writes nothing.
 */
const POLICY = { capacity: 3, refillPerSecond: 1 };

const BAD_NAMES: [string, unknown, string][] = [
  ['undefined', undefined, 'undefined'],
  ['an empty string', '', '""'],
  ['a number', 5, '5'],
  ['null', null, 'null'],
  ['an object', { id: 'a' }, 'an object'],
  ['an object without a prototype', Object.create(null), 'an object'],
  ['an array', ['a'], 'an array'],
  ['a symbol', Symbol('a'), 'a symbol'],
];

describe('BucketService refuses a bucket name that is not a non-empty string', () => {
  const scenario = redisScenario('bucket-names');
  let moduleRef: TestingModule;
  let buckets: BucketService;
  let prefix: string;

  beforeAll(async () => {
    prefix = scenario.nextKeyPrefix();
    moduleRef = await Test.createTestingModule({
      imports: [RateLimitModule.forRoot({ redis: await redisUrl(), keyPrefix: prefix })],
    }).compile();
    moduleRef.useLogger(false);
    await moduleRef.init();
    buckets = moduleRef.get(BucketService);
  });

  afterAll(() => moduleRef?.close());

  /** The calls of each method with `name`, as a caller without types (or with `as any`) makes them. */
  const calls = (name: unknown): [string, () => Promise<unknown>][] => [
    ['consume', () => buckets.consume(name as string, POLICY)],
    ['peek', () => buckets.peek(name as string, POLICY)],
    ['refund', () => buckets.refund(name as string, POLICY)],
    ['reset', () => buckets.reset(name as string)],
    ['acquire', () => buckets.acquire(name as string, POLICY)],
  ];

  it.each(BAD_NAMES)('refuses %s in consume, peek, refund, reset and acquire, naming the method', async (_, name, got) => {
    for (const [method, call] of calls(name)) {
      const error = await call().then(
        () => new Error(`${method} took it`),
        (e: unknown) => e,
      );
      expect(error).toBeInstanceOf(RateLimitConfigError);
      expect(error).toMatchObject({
        code: 'ERR_RATE_LIMIT_INVALID_POLICY',
        reason: `BucketService.${method}(): the bucket name must be a non-empty string (got ${got})`,
      });
    }
    // Nothing written under the prefix: no {undefined}, {5} or {} bucket.
    expect(await scenario.client.keys(`${prefix}*`)).toEqual([]);
  });

  it('refuses a bad name in consumeAll(), naming the entry, and drains none of the entries', async () => {
    const error = await buckets
      .consumeAll([
        { name: 'good', policy: POLICY },
        { name: undefined as unknown as string, policy: POLICY },
      ])
      .catch((e: unknown) => e);
    expect(error).toMatchObject({
      code: 'ERR_RATE_LIMIT_INVALID_POLICY',
      reason: 'BucketService.consumeAll(): entries[1].name must be a non-empty string (got undefined)',
    });
    await expect(buckets.consumeAll([{ name: 'good', policy: POLICY }, 7 as never])).rejects.toMatchObject({
      code: 'ERR_RATE_LIMIT_INVALID_CONSUME_ALL',
      reason: 'BucketService.consumeAll(): entries[1] must be { name, policy, cost? } (got 7)',
    });
    await expect(buckets.consumeAll({ name: 'good', policy: POLICY } as never)).rejects.toMatchObject({
      code: 'ERR_RATE_LIMIT_INVALID_CONSUME_ALL',
      reason: 'BucketService.consumeAll(): entries must be an array of { name, policy, cost? } (got an object)',
    });
    expect(await scenario.client.exists(`${prefix}{good}`)).toBe(0);
  });

  it('takes any non-empty string, "0" and a space included, each its own bucket', async () => {
    expect(await buckets.consume('0', POLICY)).toMatchObject({ allowed: true, remaining: 2 });
    expect(await buckets.consume(' ', POLICY)).toMatchObject({ allowed: true, remaining: 2 });
    expect(await buckets.consume('0', POLICY)).toMatchObject({ allowed: true, remaining: 1 });
    expect(await scenario.client.exists(`${prefix}{0}`)).toBe(1);
    expect(await scenario.client.keys(`${prefix}*`)).toHaveLength(2);
  });
});
