import { type CanActivate, Controller, type ExecutionContext, Get, Injectable, UseGuards } from '@nestjs/common';
import { RateLimit } from 'nest-redis-rate-limit';

/** The app's auth, reduced to a header: `x-user: 42` signs in user 42 (a number), anything else a string id. */
@Injectable()
export class HeaderUserGuard implements CanActivate {
  canActivate(context: ExecutionContext): boolean {
    const request = context.switchToHttp().getRequest();
    const user = request.headers['x-user'];
    if (typeof user === 'string' && user !== '') request.user = { id: /^\d+$/.test(user) ? Number(user) : user };
    return true;
  }
}

const tenant = (context: ExecutionContext): string => context.switchToHttp().getRequest().headers['x-tenant'];

/** Two tokens per identity that do not refill within a test (one per 1000 s): the third request is a 429. */
@Controller('buckets')
export class RouteBucketsController {
  /** Unnamed: its scope is `RouteBucketsController.byIp`. */
  @Get('ip')
  @RateLimit(2, 0.001)
  byIp() {
    return { ok: true };
  }

  @Get('login')
  @UseGuards(HeaderUserGuard)
  @RateLimit({ name: 'login', capacity: 2, refillPerSecond: 0.001, keyBy: 'user' })
  login() {
    return { ok: true };
  }

  @Get('key')
  @RateLimit({ name: 'per-key', capacity: 2, refillPerSecond: 0.001, keyBy: 'apiKey' })
  key() {
    return { ok: true };
  }

  @Get('tenant')
  @RateLimit({ name: 'tenant', capacity: 2, refillPerSecond: 0.001, keyBy: tenant })
  tenant() {
    return { ok: true };
  }

  /** A refusal costs a 30 s penalty. */
  @Get('penalised')
  @RateLimit({ name: 'penalised', capacity: 2, refillPerSecond: 1, blockSeconds: 30 })
  penalised() {
    return { ok: true };
  }

  /** One name on two routes with different numbers: peekRoute() must be told which. */
  @Get('shared-small')
  @RateLimit({ name: 'shared', capacity: 3, refillPerSecond: 0.001 })
  sharedSmall() {
    return { ok: true };
  }

  @Get('shared-large')
  @RateLimit({ name: 'shared', capacity: 5, refillPerSecond: 0.001 })
  sharedLarge() {
    return { ok: true };
  }

  /** Numbers computed per request: peekRoute() must be given them. Never requested here. */
  @Get('dynamic')
  @RateLimit({ name: 'dynamic', capacity: () => 4, refillPerSecond: 0.001 })
  dynamic() {
    return { ok: true };
  }
}
