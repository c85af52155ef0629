import 'reflect-metadata';
import { ThrottlerStorageRedisService } from '@nest-lab/throttler-storage-redis';
import type { INestApplicationContext } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { Redis } from 'ioredis';
import { RateLimiterRedis, RateLimiterRes } from 'rate-limiter-flexible';
import { BucketService, RateLimitModule } from 'nest-redis-rate-limit';
import type { LimiterName, Limits } from './settings.js';

/** One limiter seen from outside: take one unit for `key`, allowed or not. */
export interface BenchLimiter {
  consume(key: string): Promise<boolean>;
  close(): Promise<void>;
}

/** The library's Lua script, read from its build (it is not part of the public API). */
async function ourScript(): Promise<string> {
  const url = new URL('../../libs/rate-limit/dist/stores/token-bucket.script.js', import.meta.url);
  const module = (await import(url.href)) as { TOKEN_BUCKET_LUA: string };
  return module.TOKEN_BUCKET_LUA;
}

/** The key prefix each limiter writes under, inside the run's own prefix. */
export function limiterPrefix(runPrefix: string, name: LimiterName): string {
  return `${runPrefix}${name}:`;
}

/** Opens `name` configured with `limits`, writing only under `prefix`. Each uses a client of its own. */
export async function openLimiter(name: LimiterName, url: string, prefix: string, limits: Limits): Promise<BenchLimiter> {
  switch (name) {
    case 'ours': {
      const app: INestApplicationContext = await NestFactory.createApplicationContext(
        RateLimitModule.forRoot({ redis: url, keyPrefix: prefix }),
        { logger: ['error', 'warn'] },
      );
      const buckets = app.get(BucketService);
      const policy = { capacity: limits.capacity, refillPerSecond: limits.refillPerSecond };
      return {
        consume: async (key) => (await buckets.consume(key, policy)).allowed,
        close: () => app.close(),
      };
    }
    case 'evalsha': {
      // The floor: what one EVALSHA of the same script costs through a plain client, nothing around it.
      const client = new Redis(url);
      const sha = (await client.script('LOAD', await ourScript())) as string;
      const { capacity, refillPerSecond } = limits;
      return {
        consume: async (key) => {
          const reply = (await client.evalsha(sha, 1, `${prefix}{${key}}`, '', 'take', capacity, refillPerSecond, 1)) as unknown[];
          return reply[0] === 1;
        },
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
