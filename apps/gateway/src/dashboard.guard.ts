import { type CanActivate, type ExecutionContext, Injectable, Logger, UnauthorizedException } from '@nestjs/common';
import { ConfigService } from '@nestjs/config';
import { randomBytes, timingSafeEqual } from 'node:crypto';

/**
 * The demo's admin auth for the rate-limit dashboard: HTTP Basic, user `admin`, password `DASHBOARD_TOKEN`
 * (a browser asks for it, then sends it with the page's own requests). Without DASHBOARD_TOKEN, a random
 * one is made at start and logged once, as a notebook server does. A real app puts its own admin guard here.
 */
@Injectable()
export class DashboardTokenGuard implements CanActivate {
  private readonly expected: Buffer;

  constructor(config: ConfigService) {
    let token = config.get<string>('DASHBOARD_TOKEN');
    if (!token) {
      token = randomBytes(12).toString('base64url');
      new Logger('Gateway').log(`Rate-limit dashboard at /rate-limit: user admin, password ${token} (set DASHBOARD_TOKEN to choose it)`);
    }
    this.expected = Buffer.from(`Basic ${Buffer.from(`admin:${token}`).toString('base64')}`);
  }

  canActivate(context: ExecutionContext): boolean {
    const http = context.switchToHttp();
    const request = http.getRequest<{ headers: Record<string, string | undefined>; user?: unknown }>();
    const given = Buffer.from(request.headers.authorization ?? '');
    if (given.length === this.expected.length && timingSafeEqual(given, this.expected)) {
      request.user = { id: 'admin' };
      return true;
    }
    // Express and Fastify both answer header(name, value): the browser then asks for the password.
    http
      .getResponse<{ header(name: string, value: string): unknown }>()
      .header('WWW-Authenticate', 'Basic realm="rate-limit dashboard", charset="UTF-8"');
    throw new UnauthorizedException();
  }
}
