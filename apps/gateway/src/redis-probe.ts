import { Logger } from '@nestjs/common';
import { type RateLimitModuleOptions, redisAnswers } from 'nest-redis-rate-limit';

/** `url` as it may appear in a log line: its password (user info, or a `password` query parameter) replaced by `***`. */
export function withoutPassword(url: string): string {
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    return '(REDIS_URL is not a valid URL)';
  }
  if (parsed.password) parsed.password = '***';
  for (const name of [...parsed.searchParams.keys()]) {
    if (/pass/i.test(name)) parsed.searchParams.set(name, '***');
  }
  return parsed.toString().replace(/%2A%2A%2A/g, '***');
}

/** The demo's limiter options: Redis at `url` when it answers, else the in-process store with a warning. */
export async function gatewayRateLimitOptions(url: string, keyPrefix = 'gateway:'): Promise<RateLimitModuleOptions> {
  const shown = withoutPassword(url);
  if (await redisAnswers(url)) {
    new Logger('Gateway').log(`Rate limits are shared through Redis at ${shown}`);
    return { redis: url, keyPrefix };
  }
  new Logger('Gateway').warn(
    `No Redis answers at ${shown}: running on the in-process store, so limits hold per instance only. ` +
      'Start Redis or set REDIS_URL to share them.',
  );
  return { store: 'memory', keyPrefix };
}
