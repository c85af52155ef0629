import type { CanActivate, ModuleMetadata, Type } from '@nestjs/common';
import { RateLimitConfigError } from '../errors/rate-limit.errors.js';
import { nearestKey } from '../unknown-keys.js';

/** What `RateLimitDashboardModule.register()` takes. */
export interface RateLimitDashboardOptions {
  /** Where the page is served (default `'rate-limit'`): the page at `/<path>`, its assets and API below it. */
  path?: string;
  /**
   * The app's own auth: a guard class (created in this module, with `imports` for its dependencies) or
   * instance, run on the page, its assets and every API call. Required, unless `unauthenticatedOnLoopback`.
   */
  guard?: Type<CanActivate> | CanActivate;
  /**
   * Serve without a guard, to requests from the loopback interface only (a developer's machine, a
   * `kubectl port-forward`); every other request, and any request a proxy forwarded, gets 404. Default false.
   */
  unauthenticatedOnLoopback?: boolean;
  /** Who made a change, for the audit trail (default: `req.user?.id ?? req.user?.name ?? 'unknown'`); never read from the body. */
  operator?: (request: any) => string;
  /** Modules that provide the guard class's dependencies (a `JwtModule`, your `AuthModule`). Default none. */
  imports?: ModuleMetadata['imports'];
}

/** The options with their defaults: `path` without slashes at its ends. */
export interface ResolvedDashboardOptions {
  path: string;
  guard: Type<CanActivate> | CanActivate | undefined;
  unauthenticatedOnLoopback: boolean;
  operator: (request: any) => string;
  imports: NonNullable<ModuleMetadata['imports']>;
}

const KNOWN = ['path', 'guard', 'unauthenticatedOnLoopback', 'operator', 'imports'] as const;
/** Letters, digits and `- _ . ~` in segments separated by `/`: no route parameter or wildcard. */
const PATH = /^[A-Za-z0-9._~-]+(?:\/[A-Za-z0-9._~-]+)*$/;

function defaultOperator(request: { user?: { id?: unknown; name?: unknown } }): string {
  const user = request.user;
  const who = user?.id ?? user?.name;
  return who === undefined || who === null || who === '' ? 'unknown' : String(who);
}

function invalid(reason: string): never {
  throw new RateLimitConfigError('ERR_RATE_LIMIT_INVALID_OPTION', `RateLimitDashboardModule.register(): ${reason}`);
}

/**
 * Checks the options as strictly as `forRoot`'s, and refuses a dashboard that anyone could open: no
 * guard and not `unauthenticatedOnLoopback` is `ERR_RATE_LIMIT_DASHBOARD_UNGUARDED`.
 */
export function resolveDashboardOptions(options: RateLimitDashboardOptions | undefined): ResolvedDashboardOptions {
  if (options === undefined || options === null || typeof options !== 'object' || Array.isArray(options)) {
    invalid('the options must be an object ({ guard, path?, operator? })');
  }
  for (const key of Object.keys(options)) {
    if (!(KNOWN as readonly string[]).includes(key)) {
      const close = nearestKey(key, KNOWN);
      throw new RateLimitConfigError(
        'ERR_RATE_LIMIT_UNKNOWN_OPTION',
        `RateLimitDashboardModule.register(): unknown key "${key}"${close ? ` (did you mean "${close}"?)` : ''}`,
      );
    }
  }
  const raw = options.path ?? 'rate-limit';
  if (typeof raw !== 'string') invalid(`path must be a string (got ${typeof raw})`);
  const path = raw.replace(/^\/+|\/+$/g, '');
  if (!PATH.test(path) || path.length > 200) {
    invalid(`path must be segments of letters, digits and - _ . ~ separated by / (got ${JSON.stringify(raw)})`);
  }
  const { guard, operator } = options;
  const guardOk =
    guard === undefined ||
    typeof guard === 'function' ||
    (typeof guard === 'object' && guard !== null && typeof guard.canActivate === 'function');
  if (!guardOk) invalid('guard must be a guard class or an object with canActivate(context)');
  const loopback = options.unauthenticatedOnLoopback ?? false;
  if (typeof loopback !== 'boolean') invalid(`unauthenticatedOnLoopback must be true or false (got ${JSON.stringify(loopback)})`);
  if (operator !== undefined && typeof operator !== 'function') invalid('operator must be a function (request) => string');
  if (options.imports !== undefined && !Array.isArray(options.imports)) invalid('imports must be an array of modules');
  if (guard === undefined && !loopback) {
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_DASHBOARD_UNGUARDED',
      'RateLimitDashboardModule.register() has no guard: the page can block clients and change limits, so it sits behind your ' +
        "app's auth. Pass guard: YourAdminGuard, or unauthenticatedOnLoopback: true to serve it only to this machine",
    );
  }
  return { path, guard, unauthenticatedOnLoopback: loopback, operator: operator ?? defaultOperator, imports: options.imports ?? [] };
}
