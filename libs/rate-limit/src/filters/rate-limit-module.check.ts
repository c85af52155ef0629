import { Catch, type ExceptionFilter, Injectable, type OnModuleInit } from '@nestjs/common';
import { ModuleRef } from '@nestjs/core';
import { decoratedControllers, findRouteLimiter } from '../pipeline/find-route-limiter.js';

/** Never thrown: the check below catches nothing. */
class NeverThrown {}

/**
 * Fails the start of an app that uses `@RateLimit` without importing `RateLimitModule`, naming the
 * controllers. `@RateLimit` registers it as an exception filter because Nest builds every route's
 * filters at start-up (so this runs in every app that has a decorated controller) and consults them only
 * when a request throws — and then this one matches nothing. Routes pay nothing for it.
 */
@Catch(NeverThrown)
@Injectable()
export class RateLimitModuleCheck implements ExceptionFilter, OnModuleInit {
  constructor(private readonly moduleRef: ModuleRef) {}

  onModuleInit(): void {
    findRouteLimiter(this.moduleRef, '@RateLimit', () => `used on ${decoratedControllers(this.moduleRef)}`);
  }

  catch(): void {
    // Unreachable: nothing throws NeverThrown.
  }
}
