import { type CanActivate, Controller, type ExecutionContext, Get, Injectable, Module, type Type } from '@nestjs/common';
import {
  RateLimit,
  RateLimitDashboardModule,
  type RateLimitDashboardOptions,
  RateLimitModule,
  type RateLimitModuleOptions,
} from 'nest-redis-rate-limit';

/** The token of the app's own auth in these tests: a bearer header, or the `session` cookie a browser sends. */
export const ADMIN_TOKEN = 'admin-token-for-tests';

/**
 * The app's auth, as an app would have it: the `authorization: Bearer` header or a `session` cookie
 * (what a browser sends by itself, to a page of another port of the same host too: the case of a
 * cross-site forgery). It sets `req.user`, from which the dashboard takes the operator.
 */
@Injectable()
export class AdminGuard implements CanActivate {
  canActivate(context: ExecutionContext): boolean {
    const request = context.switchToHttp().getRequest<{ headers: Record<string, string | undefined>; user?: unknown }>();
    const bearer = request.headers.authorization === `Bearer ${ADMIN_TOKEN}`;
    const cookie = (request.headers.cookie ?? '').split(/;\s*/).includes(`session=${ADMIN_TOKEN}`);
    if (!bearer && !cookie) return false;
    request.user = { id: 'alice@example.com' };
    return true;
  }
}

/** The limited routes: `orders` by IP (the browser tests' traffic), `search` by user, a shadow `export`. */
@Controller()
export class ShopController {
  @Get('orders')
  @RateLimit({ capacity: 5, refillPerSecond: 0.01, name: 'orders' })
  orders() {
    return { ok: true };
  }

  @Get('search')
  @RateLimit({ capacity: 50, refillPerSecond: 10, name: 'search' })
  search() {
    return { ok: true };
  }

  @Get('export')
  @RateLimit({ capacity: 2, refillPerSecond: 0.1, name: 'export', enforce: false })
  export() {
    return { ok: true };
  }
}

/** An app with the shop's routes, `RateLimitModule` with operations on, and (unless `dashboard` is false) the dashboard. */
export function shopApp(limiter: RateLimitModuleOptions, dashboard: RateLimitDashboardOptions | false = { guard: AdminGuard }): Type {
  @Module({
    imports: [
      RateLimitModule.forRoot({ operations: true, ...limiter }),
      ...(dashboard ? [RateLimitDashboardModule.register(dashboard)] : []),
    ],
    controllers: [ShopController],
  })
  class ShopModule {}
  return ShopModule;
}
