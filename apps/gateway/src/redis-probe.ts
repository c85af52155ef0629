import { Logger } from '@nestjs/common';
import { Redis } from 'ioredis';
import type { RateLimitModuleOptions } from '@app/rate-limit';

/** Answers whether a Redis server responds to PING at `url` within `timeoutMs`. */
export async function redisAnswers(url: string, timeoutMs = 1000): Promise<boolean> {
  const client = new Redis(url, {
    lazyConnect: true,
    enableOfflineQueue: false,
    connectTimeout: timeoutMs,
    // A failed socket is already closed: don't keep a 2 s destroy timer alive after disconnect().
    disconnectTimeout: 10,
    maxRetriesPerRequest: 0,
    retryStrategy: () => null,
  });
  client.on('error', () => undefined);
  try {
    await client.connect();
    return (await client.ping()) === 'PONG';
  } catch {
    return false;
  } finally {
    client.disconnect();
  }
}

/** The demo's limiter options: Redis at `url` when it answers, else the in-process store with a warning. */
export async function gatewayRateLimitOptions(url: string, keyPrefix = 'gateway:'): Promise<RateLimitModuleOptions> {
  if (await redisAnswers(url)) {
    new Logger('Gateway').log(`Rate limits are shared through Redis at ${url}`);
    return { redis: url, keyPrefix };
  }
  new Logger('Gateway').warn(
    `No Redis answers at ${url}: running on the in-process store, so limits hold per instance only. ` +
      'Start Redis or set REDIS_URL to share them.',
  );
  return { store: 'memory', keyPrefix };
}
