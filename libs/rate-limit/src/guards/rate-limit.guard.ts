import { type CanActivate, type ExecutionContext, Injectable, type OnModuleInit } from '@nestjs/common';
import { ModuleRef } from '@nestjs/core';
import type { Verdict } from '../rate-limit.interfaces.js';
import { RATE_LIMIT_ENHANCER } from '../rate-limit.constants.js';
import { type RequestHooks, RouteLimiter } from '../pipeline/route-limiter.js';
import { findRouteLimiter } from '../pipeline/find-route-limiter.js';

/**
 * Decides the policies that do not depend on the app's own guards (`phase: 'before-guards'`: by IP, by
 * the raw API key header), leaves the state on the request for `RateLimitInterceptor`, and throws the 429.
 *
 * `RateLimitModule` registers it for the whole application. To place it yourself — `@UseGuards()`,
 * your own `APP_GUARD` provider, or a subclass that overrides the protected hooks — set
 * `forRoot({ guard: false })`. Its only dependency is `ModuleRef`, so it resolves in any module of an app
 * that imports `RateLimitModule.forRoot()`; the hooks apply to both phases of the request it decides.
 */
@Injectable()
export class RateLimitGuard implements CanActivate, OnModuleInit {
  static readonly [RATE_LIMIT_ENHANCER] = 'guard';
  private limiter: RouteLimiter | undefined;
  private readonly hooks: RequestHooks = {
    getIp: (request) => this.getIp(request),
    getUserId: (request) => this.getUserId(request),
    getApiKey: (request) => this.getApiKey(request),
    throwRateLimitException: (context, verdict) => this.throwRateLimitException(context, verdict),
  };

  constructor(protected readonly moduleRef: ModuleRef) {}

  onModuleInit(): void {
    this.limiter = findRouteLimiter(this.moduleRef, 'RateLimitGuard');
  }

  canActivate(context: ExecutionContext): boolean | Promise<boolean> {
    return this.routeLimiter.beforeGuards(context, this.hooks, this);
  }

  /** The client address. Default: `req.ip`, which honours the app's trust-proxy setting. */
  protected getIp(request: any): string | undefined {
    return this.routeLimiter.defaultHooks.getIp(request);
  }

  /** The user id for `keyBy: 'user'`. Default: `keys.user(req)`, else `req.user.id`, `userId` or `sub`. */
  protected getUserId(request: any): string | number | undefined {
    return this.routeLimiter.defaultHooks.getUserId(request);
  }

  /** The API key for `keyBy: 'apiKey'`. Default: `keys.apiKey(req)`, else the `keys.apiKeyHeader` header. */
  protected getApiKey(request: any): string | undefined | Promise<string | undefined> {
    return this.routeLimiter.defaultHooks.getApiKey(request);
  }

  /** Throws the refusal; the headers are already written. Default: `RateLimitException` (429 with `retryAfter`). */
  protected throwRateLimitException(context: ExecutionContext, verdict: Verdict): never {
    return this.routeLimiter.defaultHooks.throwRateLimitException(context, verdict);
  }

  private get routeLimiter(): RouteLimiter {
    // Also when Nest's lifecycle hooks never ran (a guard made with `new` and passed to useGlobalGuards).
    return (this.limiter ??= findRouteLimiter(this.moduleRef, 'RateLimitGuard'));
  }
}
