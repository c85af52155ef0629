import {
  Controller,
  type DynamicModule,
  Inject,
  Injectable,
  type MiddlewareConsumer,
  Module,
  type NestMiddleware,
  type NestModule,
  type Type,
  UseGuards,
} from '@nestjs/common';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { DASHBOARD_OPTIONS, DashboardController } from './dashboard.controller.js';
import { DASHBOARD_HEADERS, fromLoopback, refusedWrite } from './dashboard-security.js';
import { type RateLimitDashboardOptions, resolveDashboardOptions, type ResolvedDashboardOptions } from './dashboard.options.js';

/**
 * Before any guard, route or body parser: the headers of every answer, 404 off the loopback interface
 * when the dashboard serves itself unauthenticated, and 403 for a write that a cross-site page could have
 * sent. On Fastify too (Nest runs middleware there on the raw request, before the body is parsed).
 */
@Injectable()
class DashboardGate implements NestMiddleware {
  constructor(@Inject(DASHBOARD_OPTIONS) private readonly options: ResolvedDashboardOptions) {}

  use(request: IncomingMessage, response: ServerResponse, next: () => void): void {
    for (const [name, value] of Object.entries(DASHBOARD_HEADERS)) response.setHeader(name, value);
    if (this.options.unauthenticatedOnLoopback && !fromLoopback(request.socket.remoteAddress, request.headers)) {
      return end(response, 404, 'Not Found', 'Cannot ' + (request.method ?? 'GET') + ' ' + (request.url ?? '/').split('?')[0]);
    }
    if (request.method !== 'GET' && request.method !== 'HEAD') {
      const refused = refusedWrite(request.method, request.headers);
      if (refused !== undefined) return end(response, 403, 'Forbidden', refused);
    }
    next();
  }
}

/** Answers like Nest's own exceptions (`{ statusCode, message, error }`), without going further. */
function end(response: ServerResponse, statusCode: number, error: string, message: string): void {
  const body = JSON.stringify({ statusCode, message, error });
  response.statusCode = statusCode;
  response.setHeader('Content-Type', 'application/json; charset=utf-8');
  response.setHeader('Content-Length', Buffer.byteLength(body));
  response.end(body);
}

/**
 * The operator's page: health, policies and their overrides, allowed vs refused per second, the top
 * refused identities, an identity inspector, blocks, overrides and resets (each confirmed, each in the
 * audit trail), served from assets in the package under a strict CSP.
 *
 * ```ts
 * RateLimitModule.forRoot({ operations: true }),
 * RateLimitDashboardModule.register({ path: 'admin/rate-limit', guard: AdminGuard }),
 * ```
 *
 * It refuses to start without a guard of the app's (`ERR_RATE_LIMIT_DASHBOARD_UNGUARDED`), unless told
 * to serve only the loopback interface, unauthenticated. Changes are POSTs with a JSON body, a custom
 * header and a same-origin `Origin`: a page of another site cannot make one.
 */
/** The controller class of one registration, for its middleware's routes. */
const DASHBOARD_CONTROLLER = Symbol('RATE_LIMIT_DASHBOARD_CONTROLLER');

@Module({})
export class RateLimitDashboardModule implements NestModule {
  constructor(@Inject(DASHBOARD_CONTROLLER) private readonly controller: Type) {}

  static register(options: RateLimitDashboardOptions): DynamicModule {
    const resolved = resolveDashboardOptions(options);
    // A class of its own per registration: the path and the guard are class metadata.
    class RateLimitDashboardController extends DashboardController {}
    Controller(resolved.path)(RateLimitDashboardController);
    if (resolved.guard !== undefined) UseGuards(resolved.guard)(RateLimitDashboardController);
    return {
      module: RateLimitDashboardModule,
      imports: resolved.imports,
      controllers: [RateLimitDashboardController],
      providers: [
        { provide: DASHBOARD_OPTIONS, useValue: resolved },
        { provide: DASHBOARD_CONTROLLER, useValue: RateLimitDashboardController },
        DashboardGate,
      ],
    };
  }

  configure(consumer: MiddlewareConsumer): void {
    consumer.apply(DashboardGate).forRoutes(this.controller);
  }
}
