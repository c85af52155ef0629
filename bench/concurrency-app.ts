import 'reflect-metadata';
import { randomBytes } from 'node:crypto';
import type { AddressInfo } from 'node:net';
import {
  type CallHandler,
  Controller,
  type DynamicModule,
  type ExecutionContext,
  Get,
  HttpException,
  HttpStatus,
  Injectable,
  Module,
  type NestInterceptor,
  type OnModuleInit,
  type Type,
  UseInterceptors,
} from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { Redis } from 'ioredis';
import type { Observable } from 'rxjs';
import { ConcurrencyLimit, RateLimit, RateLimitModule } from 'nest-redis-rate-limit';
import { FloorSlots } from './concurrency-floor.js';
import { BODY } from './http-app.js';
import type { BenchModuleOptions } from './limiters.js';
import { benchRedisUrl, CONCURRENCY, LIMITS } from './settings.js';

/**
 * The app of the concurrency step (issue 36, item 4): `node dist/bench/concurrency-app.js <variant> <key prefix>`.
 * One Nest 12 + Express app with GET /work, behind:
 * - none: nothing (no module);
 * - rate: ours, `@RateLimit(B, R)` with a limit nobody reaches (the HTTP step's /allowed), default options;
 * - rate-no-coalesce: the same with `coalesce: false` (one decide.lua call per decision);
 * - slots: ours, `@ConcurrencyLimit(CONCURRENCY.limit)` (above the load's connections: nothing refused), default options;
 * - rate-slot: ours, rate's policy with `phase: 'after-guards'` and `@ConcurrencyLimit(CONCURRENCY.limit)`: the rate
 *   policy and the slot decided in one take-with-slot.lua call, the slot given back by one slot-give-back.lua call;
 * - rate-slot-apart: the same policy without a phase (keyed by IP: decided in the guard, coalesced as in rate) and
 *   `@ConcurrencyLimit(CONCURRENCY.limit)`: the rate call (decide.lua), then slot-take.lua, then slot-give-back.lua;
 * - floor: an interceptor doing the floor's take and give-back (concurrency-floor.ts), the slot given back when
 *   the response closes, writing the two headers ours writes (Concurrency-Limit, Concurrency-In-Flight).
 * Every request comes from 127.0.0.1 and every limiter keys by IP: one key per variant.
 * Prints `{"port":n}` once it listens.
 */

export const CONCURRENCY_VARIANTS = ['none', 'rate', 'rate-no-coalesce', 'slots', 'rate-slot', 'rate-slot-apart', 'floor'] as const;
export type ConcurrencyVariant = (typeof CONCURRENCY_VARIANTS)[number];

const { capacity, refillPerSecond } = LIMITS.allowed;
/** ConcurrencyLimitOptions' default leaseMs. */
const LEASE_MS = 30_000;

function floorInterceptor(prefix: string): Type<NestInterceptor> {
  const slots = new FloorSlots(new Redis(benchRedisUrl()));
  const instance = randomBytes(6).toString('base64url');
  const limit = String(CONCURRENCY.limit);
  let next = 0;
  @Injectable()
  class FloorInterceptor implements NestInterceptor, OnModuleInit {
    onModuleInit(): Promise<void> {
      return slots.load();
    }

    async intercept(context: ExecutionContext, handler: CallHandler): Promise<Observable<unknown>> {
      const http = context.switchToHttp();
      const request = http.getRequest<{ ip: string }>();
      const response = http.getResponse<{ setHeader(n: string, v: string): void; once(e: 'close', f: () => void): void }>();
      const key = `${prefix}{${request.ip}}`;
      const holder = `${instance}.${(next++).toString(36)}`;
      const inFlight = await slots.take(key, CONCURRENCY.limit, holder, LEASE_MS);
      response.setHeader('Concurrency-Limit', limit);
      response.setHeader('Concurrency-In-Flight', String(Math.abs(inFlight)));
      if (inFlight < 0) throw new HttpException('Too Many Requests', HttpStatus.TOO_MANY_REQUESTS);
      response.once('close', () => void slots.giveBack(key, holder));
      return handler.handle();
    }
  }
  return FloorInterceptor;
}

function appModule(variant: ConcurrencyVariant, prefix: string): DynamicModule {
  /** A variant of the library's with default options: `controller` and the module on the run's Redis. */
  const ours = (controller: Type): DynamicModule => ({
    module: ConcurrencyAppModule,
    imports: [RateLimitModule.forRoot({ redis: benchRedisUrl(), keyPrefix: prefix })],
    controllers: [controller],
  });
  @Module({})
  class ConcurrencyAppModule {}
  switch (variant) {
    case 'none': {
      @Controller()
      class NoneController {
        @Get('work')
        work() {
          return BODY;
        }
      }
      return { module: ConcurrencyAppModule, controllers: [NoneController] };
    }
    case 'rate':
    case 'rate-no-coalesce': {
      @Controller()
      class RateController {
        @Get('work')
        @RateLimit(capacity, refillPerSecond)
        work() {
          return BODY;
        }
      }
      const options: BenchModuleOptions = { redis: benchRedisUrl(), keyPrefix: prefix };
      if (variant === 'rate-no-coalesce') options.coalesce = false;
      return { module: ConcurrencyAppModule, imports: [RateLimitModule.forRoot(options)], controllers: [RateController] };
    }
    case 'slots': {
      @Controller()
      class SlotsController {
        @Get('work')
        @ConcurrencyLimit(CONCURRENCY.limit)
        work() {
          return BODY;
        }
      }
      return ours(SlotsController);
    }
    case 'rate-slot': {
      @Controller()
      class RateSlotController {
        @Get('work')
        @RateLimit({ capacity, refillPerSecond, phase: 'after-guards' })
        @ConcurrencyLimit(CONCURRENCY.limit)
        work() {
          return BODY;
        }
      }
      return ours(RateSlotController);
    }
    case 'rate-slot-apart': {
      @Controller()
      class RateSlotApartController {
        @Get('work')
        @RateLimit({ capacity, refillPerSecond })
        @ConcurrencyLimit(CONCURRENCY.limit)
        work() {
          return BODY;
        }
      }
      return ours(RateSlotApartController);
    }
    case 'floor': {
      @Controller()
      class FloorController {
        @Get('work')
        @UseInterceptors(floorInterceptor(prefix))
        work() {
          return BODY;
        }
      }
      return { module: ConcurrencyAppModule, controllers: [FloorController] };
    }
  }
}

async function main(): Promise<void> {
  const [variant, prefix] = process.argv.slice(2) as [ConcurrencyVariant, string];
  if (!CONCURRENCY_VARIANTS.includes(variant) || !prefix) {
    throw new Error(`usage: concurrency-app.js <${CONCURRENCY_VARIANTS.join('|')}> <key prefix>`);
  }
  const app = await NestFactory.create(appModule(variant, prefix), { logger: ['error', 'warn'] });
  process.once('SIGTERM', () => void app.close().finally(() => process.exit(0)));
  await app.listen(0, '127.0.0.1');
  const { port } = app.getHttpServer().address() as AddressInfo;
  process.stdout.write(`${JSON.stringify({ port })}\n`);
}

if (process.argv[1]?.endsWith('concurrency-app.js')) {
  main().catch((error: unknown) => {
    console.error(error);
    process.exit(1);
  });
}
