import { type CanActivate, type ExecutionContext, Injectable, type OnModuleInit } from '@nestjs/common';
import { ModuleRef } from '@nestjs/core';
import type { Verdict } from '../rate-limit.interfaces.js';
import { RATE_LIMIT_ENHANCER } from '../rate-limit.constants.js';
import type { RequestHooks } from '../pipeline/request-state.js';
import { RouteLimiter } from '../pipeline/route-limiter.js';
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
  /** The hooks this guard hands the pipeline: the module's defaults, or what a subclass overrides. */
  private hooks: RequestHooks | undefined;

  constructor(protected readonly moduleRef: ModuleRef) {}

  onModuleInit(): void {
    this.limiter = findRouteLimiter(this.moduleRef, 'RateLimitGuard');
  }

  canActivate(context: ExecutionContext): boolean | Promise<boolean> {
    const limiter = this.routeLimiter;
    return limiter.beforeGuards(context, (this.hooks ??= this.requestHooks(limiter.defaultHooks)), this);
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

  /**
   * The hooks as data for the pipeline, which never calls back into the guard: the defaults themselves,
   * and for each hook a subclass overrides, that override (which may call `super`, hence the defaults).
   */
  private requestHooks(defaults: RequestHooks): RequestHooks {
    const own = RateLimitGuard.prototype;
    return {
      getIp: this.getIp === own.getIp ? defaults.getIp : (request) => this.getIp(request),
      getUserId: this.getUserId === own.getUserId ? defaults.getUserId : (request) => this.getUserId(request),
      getApiKey: this.getApiKey === own.getApiKey ? defaults.getApiKey : (request) => this.getApiKey(request),
      throwRateLimitException:
        this.throwRateLimitException === own.throwRateLimitException
          ? defaults.throwRateLimitException
          : (context, verdict) => this.throwRateLimitException(context, verdict),
    };
  }

  private get routeLimiter(): RouteLimiter {
    // Also when Nest's lifecycle hooks never ran (a guard made with `new` and passed to useGlobalGuards).
    return (this.limiter ??= findRouteLimiter(this.moduleRef, 'RateLimitGuard'));
  }
}
