import 'reflect-metadata';
import type { AddressInfo } from 'node:net';
import { pathToFileURL } from 'node:url';
import { ThrottlerStorageRedisService } from '@nest-lab/throttler-storage-redis';
import {
  type CanActivate,
  Controller,
  type DynamicModule,
  type ExecutionContext,
  Get,
  HttpException,
  HttpStatus,
  Injectable,
  Module,
  type OnModuleInit,
  type Type,
  UseGuards,
} from '@nestjs/common';
import { APP_GUARD, NestFactory } from '@nestjs/core';
import { Throttle, ThrottlerGuard, ThrottlerModule } from '@nestjs/throttler';
import { Redis } from 'ioredis';
import { RateLimiterRedis, RateLimiterRes } from 'rate-limiter-flexible';
import { RateLimit, RateLimitModule } from 'nest-redis-rate-limit';
import { REFERENCE_REMAINING_LUA } from './reference-script.js';
import { benchRedisUrl, HTTP_VARIANTS, type HttpVariant, LIMITS, type Limits } from './settings.js';

/**
 * One benchmark app: `node dist/bench/http-app.js <variant> <key prefix>`. The same Express app with
 * `GET /allowed` (a limit nobody reaches) and `GET /denied` (a limit everyone exceeds), behind one
 * limiter, each configured the way its documentation shows, or behind one of the two floors.
 * Prints `{"port":n}` once it listens. The leases step's app (leases-app.ts) imports its guards.
 */

export const BODY = { hello: 'world' };
/**
 * BENCH_DENIED_LIMITS=no-refill (the instructions step): /denied refills one token per 10,000 s, so
 * that after its first 10 requests every request is refused the same way, however slowly it is served.
 */
const { allowed, denied } = {
  allowed: LIMITS.allowed,
  denied: process.env.BENCH_DENIED_LIMITS === 'no-refill' ? LIMITS.deniedNoRefill : LIMITS.denied,
};
const REDIS_URL = benchRedisUrl();

/** A 429 built without a stack trace (as ours builds its refusals): what is left is Nest's own cost. */
function tooManyRequests(): HttpException {
  const depth = Error.stackTraceLimit;
  Error.stackTraceLimit = 0;
  try {
    return new HttpException('Too Many Requests', HttpStatus.TOO_MANY_REQUESTS);
  } finally {
    Error.stackTraceLimit = depth;
  }
}

/** The limits of a route, for the guards written here (rate-limiter-flexible's and the minimal guard). */
const BENCH_LIMITS = 'BENCH:LIMITS';
export const Limited = (limits: Limits) => (_t: object, _k: string | symbol, d: PropertyDescriptor) => {
  Reflect.defineMetadata(BENCH_LIMITS, limits, d.value as object);
};

@Controller()
class NoLimiterController {
  @Get('allowed')
  allowed() {
    return BODY;
  }

  @Get('denied')
  denied() {
    return BODY;
  }
}

@Controller()
class OursController {
  @Get('allowed')
  @RateLimit(allowed.capacity, allowed.refillPerSecond)
  allowed() {
    return BODY;
  }

  @Get('denied')
  @RateLimit(denied.capacity, denied.refillPerSecond)
  denied() {
    return BODY;
  }
}

@Controller()
class ThrottlerController {
  @Get('allowed')
  allowed() {
    return BODY;
  }

  @Get('denied')
  @Throttle({ default: { limit: denied.limit, ttl: denied.windowMs } })
  denied() {
    return BODY;
  }
}

/** rate-limiter-flexible ships no Nest guard: this is the short one its users write, one limiter per route. */
export function rlfGuard(prefix: string): Type<CanActivate> {
  const client = new Redis(REDIS_URL);
  const limiters = new Map<Function, RateLimiterRedis | null>();
  @Injectable()
  class RateLimiterFlexibleGuard implements CanActivate {
    async canActivate(context: ExecutionContext): Promise<boolean> {
      const handler = context.getHandler();
      let limiter = limiters.get(handler);
      if (limiter === undefined) {
        const limits: Limits | undefined = Reflect.getMetadata(BENCH_LIMITS, handler);
        limiter = limits
          ? new RateLimiterRedis({
              storeClient: client,
              keyPrefix: `${prefix}${handler.name}`,
              points: limits.limit,
              duration: limits.windowMs / 1000,
            })
          : null;
        limiters.set(handler, limiter);
      }
      if (limiter === null) return true;
      const http = context.switchToHttp();
      const request = http.getRequest();
      const response = http.getResponse();
      try {
        const result = await limiter.consume(request.ip);
        setHeaders(response, limiter.points, result);
        return true;
      } catch (rejection) {
        if (!(rejection instanceof RateLimiterRes)) throw rejection;
        setHeaders(response, limiter.points, rejection);
        response.setHeader('Retry-After', String(Math.ceil(rejection.msBeforeNext / 1000)));
        // As its users write it (a stack trace included): the floors below are the ones built without.
        throw new HttpException('Too Many Requests', HttpStatus.TOO_MANY_REQUESTS);
      }
    }
  }
  return RateLimiterFlexibleGuard;
}

function setHeaders(response: { setHeader(name: string, value: string): void }, points: number, result: RateLimiterRes): void {
  response.setHeader('X-RateLimit-Limit', String(points));
  response.setHeader('X-RateLimit-Remaining', String(result.remainingPoints));
  response.setHeader('X-RateLimit-Reset', String(Math.ceil(result.msBeforeNext / 1000)));
}

/** rate-limiter-flexible's guard and the minimal guard read the same per-route limits. */
@Controller()
class LimitedController {
  @Get('allowed')
  @Limited(allowed)
  allowed() {
    return BODY;
  }

  @Get('denied')
  @Limited(denied)
  denied() {
    return BODY;
  }
}

/** What the minimal guard knows of a route, computed once. */
interface MinimalRoute {
  keyPrefix: string;
  capacity: number;
  refillPerSecond: number;
  limit: string;
  policy: string;
}

/**
 * The allowed-path floor: the least a correct token-bucket guard does. One EVALSHA of the reference
 * script (its reply: tokens left, or minus the ms until the next token), and the headers ours writes
 * by default (legacyHeaders: X-RateLimit-*, standardHeaders 'draft-6': RateLimit-Limit / -Remaining /
 * -Reset / -Policy, and Retry-After on a refusal) with the same values, keyed by IP like ours.
 */
export function minimalGuard(prefix: string): Type<CanActivate> {
  const client = new Redis(REDIS_URL);
  const routes = new Map<Function, MinimalRoute | null>();
  let sha = '';
  @Injectable()
  class MinimalGuard implements CanActivate, OnModuleInit {
    async onModuleInit(): Promise<void> {
      sha = (await client.script('LOAD', REFERENCE_REMAINING_LUA)) as string;
    }

    async canActivate(context: ExecutionContext): Promise<boolean> {
      const handler = context.getHandler();
      let route = routes.get(handler);
      if (route === undefined) {
        const limits: Limits | undefined = Reflect.getMetadata(BENCH_LIMITS, handler);
        route = limits
          ? {
              keyPrefix: `${prefix}${handler.name}:`,
              capacity: limits.capacity,
              refillPerSecond: limits.refillPerSecond,
              limit: String(limits.capacity),
              policy: `${limits.capacity};w=${Math.ceil(limits.capacity / limits.refillPerSecond)}`,
            }
          : null;
        routes.set(handler, route);
      }
      if (route === null) return true;
      const http = context.switchToHttp();
      const request = http.getRequest();
      const response = http.getResponse();
      const reply = (await client.evalsha(sha, 1, `${route.keyPrefix}{${request.ip}}`, route.capacity, route.refillPerSecond)) as number;
      const allowedNow = reply >= 0;
      // Denied: the bucket holds 1 - wait·R tokens, wait = -reply ms.
      const tokens = allowedNow ? reply : 1 + (reply * route.refillPerSecond) / 1000;
      const remaining = String(allowedNow ? reply : 0);
      const reset = String(Math.max(0, Math.ceil((route.capacity - tokens) / route.refillPerSecond)));
      response.setHeader('X-RateLimit-Limit', route.limit);
      response.setHeader('X-RateLimit-Remaining', remaining);
      response.setHeader('X-RateLimit-Reset', reset);
      response.setHeader('RateLimit-Limit', route.limit);
      response.setHeader('RateLimit-Remaining', remaining);
      response.setHeader('RateLimit-Reset', reset);
      response.setHeader('RateLimit-Policy', route.policy);
      if (allowedNow) return true;
      response.setHeader('Retry-After', String(Math.ceil(-reply / 1000)));
      throw tooManyRequests();
    }
  }
  return MinimalGuard;
}

/** The denied-path floor: refuses every request of the route it guards, touching nothing else. */
@Injectable()
class ThrowOnlyGuard implements CanActivate {
  canActivate(): boolean {
    throw tooManyRequests();
  }
}

/** The same refusal one event-loop turn later, as a guard that waited for a Redis reply refuses. */
@Injectable()
class ThrowLaterGuard implements CanActivate {
  canActivate(): Promise<boolean> {
    return new Promise((_resolve, reject) => setImmediate(() => reject(tooManyRequests())));
  }
}

/** GET /allowed open, GET /denied behind `guard`: the app of the refusal-only variants. */
function refusingController(guard: Type<CanActivate>): Type<unknown> {
  @Controller()
  class RefusingController {
    @Get('allowed')
    allowed() {
      return BODY;
    }

    @Get('denied')
    @UseGuards(guard)
    denied() {
      return BODY;
    }
  }
  return RefusingController;
}

function appModule(variant: HttpVariant, prefix: string): DynamicModule {
  @Module({})
  class BenchAppModule {}
  switch (variant) {
    case 'none':
      return { module: BenchAppModule, controllers: [NoLimiterController] };
    case 'ours':
    case 'ours-no-deny-cache':
    case 'ours-operations':
      return {
        module: BenchAppModule,
        imports: [
          RateLimitModule.forRoot({
            redis: REDIS_URL,
            keyPrefix: prefix,
            denyCache: variant !== 'ours-no-deny-cache',
            // Analytics counted per decision and written by one periodic call per second (issue 33).
            ...(variant === 'ours-operations' ? { operations: true } : {}),
            // The instructions step: under valgrind the app is ~50× slower, and the deadline's one timer
            // fires every timeoutMs of wall time while decisions are pending; a longer one keeps the
            // count of work done per request independent of the machine's speed.
            ...(process.env.BENCH_OURS_TIMEOUT_MS ? { timeoutMs: Number(process.env.BENCH_OURS_TIMEOUT_MS) } : {}),
          }),
        ],
        controllers: [OursController],
      };
    case 'nestjs-throttler':
      return {
        module: BenchAppModule,
        imports: [
          ThrottlerModule.forRoot({
            throttlers: [{ name: 'default', limit: allowed.limit, ttl: allowed.windowMs }],
            // ioredis' keyPrefix keeps the storage's keys under the run's prefix.
            storage: new ThrottlerStorageRedisService(new Redis(REDIS_URL, { keyPrefix: prefix })),
          }),
        ],
        controllers: [ThrottlerController],
        providers: [{ provide: APP_GUARD, useClass: ThrottlerGuard }],
      };
    case 'rate-limiter-flexible':
      return {
        module: BenchAppModule,
        controllers: [LimitedController],
        providers: [{ provide: APP_GUARD, useClass: rlfGuard(prefix) }],
      };
    case 'minimal-guard':
      return {
        module: BenchAppModule,
        controllers: [LimitedController],
        providers: [{ provide: APP_GUARD, useClass: minimalGuard(prefix) }],
      };
    case 'throw-only':
      return { module: BenchAppModule, controllers: [refusingController(ThrowOnlyGuard)] };
    case 'throw-later':
      return { module: BenchAppModule, controllers: [refusingController(ThrowLaterGuard)] };
  }
}

async function main(): Promise<void> {
  const [variant, prefix] = process.argv.slice(2) as [HttpVariant, string];
  if (!HTTP_VARIANTS.includes(variant) || !prefix) {
    throw new Error(`usage: http-app.js <${HTTP_VARIANTS.join('|')}> <key prefix>`);
  }
  const app = await NestFactory.create(appModule(variant, prefix), { logger: ['error', 'warn'] });
  // Exit on SIGTERM through process.exit, so that a --cpu-prof profile gets written.
  process.once('SIGTERM', () => void app.close().finally(() => process.exit(0)));
  await app.listen(0, '127.0.0.1');
  const { port } = app.getHttpServer().address() as AddressInfo;
  process.stdout.write(`${JSON.stringify({ port })}\n`);
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  main().catch((error: unknown) => {
    console.error(error);
    process.exit(1);
  });
}
