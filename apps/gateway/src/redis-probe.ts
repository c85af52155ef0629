import { Logger } from '@nestjs/common';
import { type RateLimitModuleOptions, redisAnswers } from 'nest-redis-rate-limit';

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
