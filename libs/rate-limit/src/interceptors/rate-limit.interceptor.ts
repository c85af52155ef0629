import { type CallHandler, type ExecutionContext, Injectable, type NestInterceptor, type OnModuleInit } from '@nestjs/common';
import { ModuleRef } from '@nestjs/core';
import type { Observable } from 'rxjs';
import { RATE_LIMIT_ENHANCER } from '../rate-limit.constants.js';
import { decoratedControllers, findRouteLimiter } from '../pipeline/find-route-limiter.js';
import type { RouteLimiter } from '../pipeline/route-limiter.js';

/**
 * Runs after the app's guards: decides the policies that need what those guards establish
 * (`phase: 'after-guards'`: the user, a verified API key, keyBy functions, per-request numbers), gives
 * back the guard's take if one of them refuses, and writes the headers of allowed responses. After the
 * handler, it gives back the tokens of policies whose `refundOn` matches the outcome.
 *
 * `@RateLimit()` applies it where a policy may need it (see `needsInterceptor`: `phase: 'after-guards'`;
 * without a phase, a keyBy other than `'ip'` or a number computed per request; or `refundOn`).
 * `RateLimitModule` registers it globally only when module `defaults` need it, and puts it on every
 * WebSocket and microservice handler with a policy: unlimited routes, and routes whose policies are all
 * per IP with fixed numbers and no `refundOn`, never pay for it.
 */
@Injectable()
export class RateLimitInterceptor implements NestInterceptor, OnModuleInit {
  static readonly [RATE_LIMIT_ENHANCER] = 'interceptor';
  private limiter: RouteLimiter | undefined;

  constructor(private readonly moduleRef: ModuleRef) {}

  onModuleInit(): void {
    this.limiter = findRouteLimiter(this.moduleRef, '@RateLimit', () => `used on ${decoratedControllers(this.moduleRef)}`);
  }

  intercept(context: ExecutionContext, next: CallHandler): Observable<unknown> | Promise<Observable<unknown>> {
    this.limiter ??= findRouteLimiter(this.moduleRef, 'RateLimitInterceptor');
    return this.limiter.aroundHandler(context, next);
  }
}
