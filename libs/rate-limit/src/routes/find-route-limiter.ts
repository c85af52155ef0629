import type { ModuleRef } from '@nestjs/core';
import { RouteLimiter } from './route-limiter.js';

/**
 * The app's `RouteLimiter`, from whichever module the guard or interceptor lives in: `@RateLimit()` and
 * `@UseGuards(RateLimitGuard)` put them in the user's modules, which need not import `RateLimitModule`.
 */
export function findRouteLimiter(moduleRef: ModuleRef, who: string, where?: () => string): RouteLimiter {
  try {
    return moduleRef.get(RouteLimiter, { strict: false });
  } catch {
    throw new Error(
      `${who}${where ? ` (${where()})` : ''} needs RateLimitModule, which this application does not import: ` +
        'add RateLimitModule.forRoot({ ... }) or RateLimitModule.forRootAsync({ ... }) to the imports of your root module',
    );
  }
}
