import { SetMetadata } from '@nestjs/common';
import { RATE_LIMIT_SKIP } from '../rate-limit.constants.js';
import { RateLimitConfigError } from '../errors/rate-limit.errors.js';

/**
 * Exempts a controller or handler from rate limiting, module `defaults` included. With names, only the
 * policies of those names are skipped (`@SkipRateLimit('burst')`); a name that matches nothing stops the
 * application at start-up (on a handler: none of its policies; on a controller: none of its handlers'). `@SkipRateLimit(false)` on a handler undoes its controller's skip.
 */
export function SkipRateLimit(skip?: boolean): ClassDecorator & MethodDecorator;
export function SkipRateLimit(...names: string[]): ClassDecorator & MethodDecorator;
export function SkipRateLimit(...args: unknown[]): ClassDecorator & MethodDecorator {
  if (args.length === 0) return SetMetadata(RATE_LIMIT_SKIP, true);
  if (args.length === 1 && typeof args[0] === 'boolean') return SetMetadata(RATE_LIMIT_SKIP, args[0]);
  for (const name of args) {
    if (typeof name !== 'string' || name === '') {
      throw new RateLimitConfigError(
        'ERR_RATE_LIMIT_INVALID_SKIP',
        `@SkipRateLimit() takes policy names (non-empty strings) or one boolean (got ${JSON.stringify(args)})`,
      );
    }
  }
  return SetMetadata(RATE_LIMIT_SKIP, args as string[]);
}
