import {
  type CallHandler,
  type ExecutionContext,
  Injectable,
  type NestInterceptor,
  type OnModuleInit,
} from '@nestjs/common';
import { ModuleRef, ModulesContainer } from '@nestjs/core';
import type { Observable } from 'rxjs';
import { RATE_LIMIT_POLICIES } from '../rate-limit.constants.js';
import { findRouteLimiter } from '../routes/find-route-limiter.js';
import type { RouteLimiter } from '../routes/route-limiter.js';

/**
 * Runs after the app's guards on every limited route: decides the policies that need what those guards
 * establish (`phase: 'after-guards'`: the user, a verified API key, keyBy functions), gives back the
 * guard's take if one of them refuses, and writes the headers of allowed responses.
 *
 * `@RateLimit()` applies it to what it decorates, and `RateLimitModule` registers it globally only when
 * module `defaults` limit routes without a decorator: unlimited routes never pay for it.
 */
@Injectable()
export class RateLimitInterceptor implements NestInterceptor, OnModuleInit {
  private limiter: RouteLimiter | undefined;

  constructor(private readonly moduleRef: ModuleRef) {}

  onModuleInit(): void {
    this.limiter = findRouteLimiter(this.moduleRef, '@RateLimit', () => this.decoratedControllers());
  }

  intercept(context: ExecutionContext, next: CallHandler): Observable<unknown> | Promise<Observable<unknown>> {
    this.limiter ??= findRouteLimiter(this.moduleRef, '@RateLimit');
    const decided = this.limiter.afterGuards(context);
    return decided === undefined ? next.handle() : decided.then(() => next.handle());
  }

  /** Names the controllers that use `@RateLimit`, for the error of an app that lacks the module. */
  private decoratedControllers(): string {
    const names = new Set<string>();
    for (const module of this.moduleRef.get(ModulesContainer, { strict: false }).values()) {
      for (const wrapper of module.controllers.values()) {
        const controller = wrapper.metatype as Function | null;
        if (typeof controller !== 'function') continue;
        const methods = Object.getOwnPropertyNames(controller.prototype).map((name) => controller.prototype[name]);
        if ([controller, ...methods].some((target) => typeof target === 'function' && Reflect.hasMetadata(RATE_LIMIT_POLICIES, target))) {
          names.add(controller.name);
        }
      }
    }
    return `used on ${[...names].join(', ') || 'a controller'}`;
  }
}
