import 'reflect-metadata';
import { ThrottlerStorageRedisService } from '@nest-lab/throttler-storage-redis';
import type { INestApplicationContext } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { Redis } from 'ioredis';
import { RateLimiterRedis, RateLimiterRes } from 'rate-limiter-flexible';
import { BucketService, RateLimitModule, type RateLimitModuleOptions } from 'nest-redis-rate-limit';
import { REFERENCE_LUA } from './reference-script.js';
import type { DecisionLimiter, LimiterName, Limits } from './settings.js';

/** One limiter seen from outside: take one unit for `key`, allowed or not. */
export interface BenchLimiter {
  consume(key: string): Promise<boolean>;
  close(): Promise<void>;
}

/**
 * A tag of the same length for every limiter: MEMORY USAGE counts the key name, and a longer prefix
 * can move a key into a larger allocation class. Ours keeps the tag it always had ('ours').
 */
const TAGS: Record<LimiterName, string> = {
  ours: 'ours',
  'ours-no-coalesce': 'ounc',
  reference: 'refs',
  'rate-limiter-flexible': 'rlfx',
  'nestjs-throttler': 'thrt',
};

/** The tag of the baseline's ours (`ours@<sha>`, BENCH_BASELINE): the same length as the others. */
const BASELINE_TAG = 'base';

/** The key prefix each limiter writes under, inside the run's own prefix (same length for all). */
export function limiterPrefix(runPrefix: string, name: DecisionLimiter): string {
  return `${runPrefix}${name.startsWith('ours@') ? BASELINE_TAG : TAGS[name as LimiterName]}:`;
}

/**
 * Module options with `coalesce` (decisions pending in the same event-loop turn sent as one script
 * call; default true), typed so that this compiles before and after the option exists.
 */
export type BenchModuleOptions = RateLimitModuleOptions & { coalesce?: boolean };

/** Opens `name` configured with `limits`, writing only under `prefix`. Each uses a client of its own. */
export async function openLimiter(name: LimiterName, url: string, prefix: string, limits: Limits): Promise<BenchLimiter> {
  switch (name) {
    case 'ours':
    case 'ours-no-coalesce': {
      const options: BenchModuleOptions = { redis: url, keyPrefix: prefix };
      if (name === 'ours-no-coalesce') options.coalesce = false;
      const app: INestApplicationContext = await NestFactory.createApplicationContext(RateLimitModule.forRoot(options), {
        logger: ['error', 'warn'],
      });
      const buckets = app.get(BucketService);
      const policy = { capacity: limits.capacity, refillPerSecond: limits.refillPerSecond };
      return {
        consume: async (key) => (await buckets.consume(key, policy)).allowed,
        close: () => app.close(),
      };
    }
    case 'reference': {
      // The floor: the cheapest correct token-bucket script, one EVALSHA through a plain client.
      const client = new Redis(url);
      const sha = (await client.script('LOAD', REFERENCE_LUA)) as string;
      const { capacity, refillPerSecond } = limits;
      return {
        consume: async (key) => (await client.evalsha(sha, 1, `${prefix}{${key}}`, capacity, refillPerSecond)) === 1,
        close: async () => void (await client.quit()),
      };
    }
    case 'rate-limiter-flexible': {
      const client = new Redis(url);
      const limiter = new RateLimiterRedis({
        storeClient: client,
        keyPrefix: prefix.slice(0, -1),
        points: limits.limit,
        duration: limits.windowMs / 1000,
      });
      return {
        consume: (key) =>
          limiter.consume(key).then(
            () => true,
            (rejection: unknown) => {
              if (rejection instanceof RateLimiterRes) return false;
              throw rejection;
            },
          ),
        close: async () => void (await client.quit()),
      };
    }
    case 'nestjs-throttler': {
      // ioredis' keyPrefix puts the storage's `{key:name}:hits` keys under the run's prefix.
      const storage = new ThrottlerStorageRedisService(new Redis(url, { keyPrefix: prefix }));
      const { limit, windowMs } = limits;
      return {
        // ThrottlerGuard denies exactly when the storage says the key is blocked.
        consume: async (key) => !(await storage.increment(key, windowMs, limit, windowMs, 'default')).isBlocked,
        close: async () => storage.onModuleDestroy(),
      };
    }
  }
}
