import 'reflect-metadata';
import type { AddressInfo } from 'node:net';
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
  type Type,
} from '@nestjs/common';
import { APP_GUARD, NestFactory } from '@nestjs/core';
import { Throttle, ThrottlerGuard, ThrottlerModule } from '@nestjs/throttler';
import { Redis } from 'ioredis';
import { RateLimiterRedis, RateLimiterRes } from 'rate-limiter-flexible';
import { RateLimit, RateLimitModule } from 'nest-redis-rate-limit';
import { HTTP_VARIANTS, type HttpVariant, LIMITS, REDIS_URL } from './settings.js';

/**
 * One benchmark app: `node dist/bench/http-app.js <variant> <key prefix>`. The same Express app with
 * `GET /allowed` (a limit nobody reaches) and `GET /denied` (a limit everyone exceeds), behind one
 * limiter, each configured the way its documentation shows. Prints `{"port":n}` once it listens.
 */

const BODY = { hello: 'world' };
const { allowed, denied } = LIMITS;

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
const RLF_POINTS = 'BENCH:RLF_POINTS';
const RlfLimit = (points: number, windowMs: number) => (_t: object, _k: string | symbol, d: PropertyDescriptor) => {
  Reflect.defineMetadata(RLF_POINTS, { points, duration: windowMs / 1000 }, d.value as object);
};

function rlfGuard(prefix: string): Type<CanActivate> {
  const client = new Redis(REDIS_URL);
  const limiters = new Map<Function, RateLimiterRedis | null>();
  @Injectable()
  class RateLimiterFlexibleGuard implements CanActivate {
    async canActivate(context: ExecutionContext): Promise<boolean> {
      const handler = context.getHandler();
      let limiter = limiters.get(handler);
      if (limiter === undefined) {
        const options: { points: number; duration: number } | undefined = Reflect.getMetadata(RLF_POINTS, handler);
        limiter = options
          ? new RateLimiterRedis({ storeClient: client, keyPrefix: `${prefix}${handler.name}`, ...options })
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

@Controller()
class RateLimiterFlexibleController {
  @Get('allowed')
  @RlfLimit(allowed.limit, allowed.windowMs)
  allowed() {
    return BODY;
  }

  @Get('denied')
  @RlfLimit(denied.limit, denied.windowMs)
  denied() {
    return BODY;
  }
}

function appModule(variant: HttpVariant, prefix: string): DynamicModule {
  @Module({})
  class BenchAppModule {}
  switch (variant) {
    case 'none':
      return { module: BenchAppModule, controllers: [NoLimiterController] };
    case 'ours':
    case 'ours-no-deny-cache':
      return {
        module: BenchAppModule,
        imports: [
          RateLimitModule.forRoot({ redis: REDIS_URL, keyPrefix: prefix, denyCache: variant === 'ours' }),
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
        controllers: [RateLimiterFlexibleController],
        providers: [{ provide: APP_GUARD, useClass: rlfGuard(prefix) }],
      };
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

main().catch((error: unknown) => {
  console.error(error);
  process.exit(1);
});
