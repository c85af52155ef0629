import { Injectable, Module } from '@nestjs/common';
import { ConfigModule, ConfigService } from '@nestjs/config';
import { Test } from '@nestjs/testing';
import { Redis } from 'ioredis';
import { BucketService, RateLimitModule, type RateLimitModuleOptions, type RateLimitOptionsFactory } from 'nest-redis-rate-limit';
import { deleteKeys, keysUnder, redisUrl, testPrefix } from '../../support/redis.js';

const POLICY = { capacity: 2, refillPerSecond: 0.01 };

/** A feature module that injects BucketService without importing RateLimitModule itself. */
@Injectable()
class ExportQuota {
  constructor(readonly buckets: BucketService) {}
}
@Module({ providers: [ExportQuota], exports: [ExportQuota] })
class FeatureModule {}

describe('RateLimitModule.forRoot / forRootAsync', () => {
  const prefix = testPrefix('module-async');
  let client: Redis;
  let url: string;

  beforeAll(async () => {
    url = await redisUrl();
    client = new Redis(url);
  });

  afterAll(async () => {
    await deleteKeys(client, prefix);
    await client.quit();
  });

  /** Compiles `imports`, consumes twice from one bucket and returns the service and the keys written. */
  async function exercise(imports: any[], keyPrefix: string, get: (ref: any) => BucketService) {
    const moduleRef = await Test.createTestingModule({ imports }).compile();
    await moduleRef.init();
    const buckets = get(moduleRef);
    const first = await buckets.consume('quota', POLICY);
    const second = await buckets.consume('quota', POLICY);
    const third = await buckets.consume('quota', POLICY);
    const keys = await keysUnder(client, keyPrefix);
    await moduleRef.close();
    return { first, second, third, keys };
  }

  it('takes its options from ConfigService through useFactory', async () => {
    const keyPrefix = `${prefix}factory:`;
    const result = await exercise(
      [
        ConfigModule.forRoot({ ignoreEnvFile: true, load: [() => ({ RL_REDIS: url, RL_PREFIX: keyPrefix })] }),
        RateLimitModule.forRootAsync({
          imports: [ConfigModule],
          inject: [ConfigService],
          useFactory: (config: ConfigService): RateLimitModuleOptions => ({
            redis: config.getOrThrow<string>('RL_REDIS'),
            keyPrefix: config.getOrThrow<string>('RL_PREFIX'),
          }),
        }),
      ],
      keyPrefix,
      (ref) => ref.get(BucketService),
    );
    expect([result.first.remaining, result.second.remaining]).toEqual([1, 0]);
    expect(result.third.allowed).toBe(false);
    expect(result.keys).toEqual([`${keyPrefix}{quota}`]);
  });

  it('builds its options with a class through useClass', async () => {
    const keyPrefix = `${prefix}class:`;
    @Injectable()
    class RateLimitConfig implements RateLimitOptionsFactory {
      createRateLimitOptions(): RateLimitModuleOptions {
        return { redis: url, keyPrefix };
      }
    }
    const result = await exercise([RateLimitModule.forRootAsync({ useClass: RateLimitConfig })], keyPrefix, (ref) =>
      ref.get(BucketService),
    );
    expect(result.third.allowed).toBe(false);
    expect(result.keys).toEqual([`${keyPrefix}{quota}`]);
  });

  it('reuses an options provider of another module through useExisting', async () => {
    const keyPrefix = `${prefix}existing:`;
    @Injectable()
    class SharedConfig implements RateLimitOptionsFactory {
      async createRateLimitOptions(): Promise<RateLimitModuleOptions> {
        return { redis: url, keyPrefix };
      }
    }
    @Module({ providers: [SharedConfig], exports: [SharedConfig] })
    class SharedConfigModule {}
    const result = await exercise(
      [RateLimitModule.forRootAsync({ imports: [SharedConfigModule], useExisting: SharedConfig })],
      keyPrefix,
      (ref) => ref.get(BucketService),
    );
    expect(result.keys).toEqual([`${keyPrefix}{quota}`]);
  });

  it('makes BucketService injectable everywhere with isGlobal', async () => {
    const keyPrefix = `${prefix}global:`;
    const result = await exercise(
      [RateLimitModule.forRoot({ redis: url, keyPrefix, isGlobal: true }), FeatureModule],
      keyPrefix,
      (ref) => ref.get(ExportQuota).buckets,
    );
    expect(result.first.allowed).toBe(true);
    expect(result.keys).toEqual([`${keyPrefix}{quota}`]);
  });

  it('does not leak isGlobal into a feature module without it', async () => {
    await expect(
      Test.createTestingModule({ imports: [RateLimitModule.forRoot({ redis: url, keyPrefix: prefix }), FeatureModule] }).compile(),
    ).rejects.toThrow(/BucketService/);
  });

  it('peeks without taking and resets a bucket to full', async () => {
    const moduleRef = await Test.createTestingModule({
      imports: [RateLimitModule.forRoot({ redis: url, keyPrefix: `${prefix}peek:` })],
    }).compile();
    await moduleRef.init();
    const buckets = moduleRef.get(BucketService);
    const policy = { capacity: 5, refillPerSecond: 0.01 };
    await buckets.consume('user:42:export', policy, 3);
    expect((await buckets.peek('user:42:export', policy)).remaining).toBe(2);
    expect((await buckets.peek('user:42:export', policy)).remaining).toBe(2);
    const denied = await buckets.consume('user:42:export', policy, 3);
    expect(denied).toMatchObject({ allowed: false, remaining: 2, limit: 5 });
    expect(denied.retryAfterSeconds).toBeGreaterThanOrEqual(99);
    await buckets.reset('user:42:export');
    expect(await buckets.peek('user:42:export', policy)).toMatchObject({ allowed: true, remaining: 5, resetSeconds: 0 });
    await expect(buckets.consume('user:42:export', policy, 6)).rejects.toThrow(/cost must be an integer from 1 to capacity 5/);
    await moduleRef.close();
  });

  it('in the memory store keeps the same arithmetic in one process', async () => {
    const moduleRef = await Test.createTestingModule({ imports: [RateLimitModule.forRoot({ store: 'memory' })] }).compile();
    await moduleRef.init();
    const buckets = moduleRef.get(BucketService);
    const decisions = await Promise.all(Array.from({ length: 30 }, () => buckets.consume('m', { capacity: 10, refillPerSecond: 0.01 })));
    expect(decisions.filter((d) => d.allowed)).toHaveLength(10);
    await moduleRef.close();
  });
});
