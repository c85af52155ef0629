import { type ModuleRef, ModulesContainer } from '@nestjs/core';
import { RATE_LIMIT_POLICIES } from '../rate-limit.constants.js';
import { RouteLimiter } from './route-limiter.js';
import { RateLimitConfigError } from '../errors/rate-limit.errors.js';

/**
 * The app's `RouteLimiter`, from whichever module the guard or interceptor lives in: `@RateLimit()` and
 * `@UseGuards(RateLimitGuard)` put them in the user's modules, which need not import `RateLimitModule`.
 */
export function findRouteLimiter(moduleRef: ModuleRef, who: string, where?: () => string): RouteLimiter {
  try {
    return moduleRef.get(RouteLimiter, { strict: false });
  } catch {
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_MODULE_NOT_IMPORTED',
      `${who}${where ? ` (${where()})` : ''} needs RateLimitModule, which this application does not import: ` +
        'add RateLimitModule.forRoot({ ... }) or RateLimitModule.forRootAsync({ ... }) to the imports of your root module',
    );
  }
}

/** The controllers of the app that use `@RateLimit`, by name, for the error of an app that lacks the module. */
export function decoratedControllers(moduleRef: ModuleRef): string {
  const names = new Set<string>();
  for (const module of moduleRef.get(ModulesContainer, { strict: false }).values()) {
    for (const wrapper of module.controllers.values()) {
      const controller = wrapper.metatype as Function | null;
      if (typeof controller !== 'function') continue;
      const methods = Object.getOwnPropertyNames(controller.prototype).map((name) => controller.prototype[name]);
      if ([controller, ...methods].some((target) => typeof target === 'function' && Reflect.hasMetadata(RATE_LIMIT_POLICIES, target))) {
        names.add(controller.name);
      }
    }
  }
  return [...names].join(', ') || 'a controller';
}
