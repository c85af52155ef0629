import 'reflect-metadata';
import type { AddressInfo } from 'node:net';
import { Controller, type DynamicModule, Get, Module, UseGuards } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { RateLimit, RateLimitModule } from 'nest-redis-rate-limit';
import { BODY, Limited, minimalGuard, rlfGuard } from './http-app.js';
import { benchRedisUrl, LIMITS } from './settings.js';

/**
 * The app of the leases step (issue 35): `node dist/bench/leases-app.js <key prefix>`. One Nest 12 +
 * Express app with one route per variant, all with a limit nobody reaches (capacity and refill 1e9:
 * every decision allowed, so the figures are the cost of deciding). Every request of the bench comes
 * from 127.0.0.1 and each limiter here keys by IP, so each route is one hot key for all the processes
 * started with the same prefix.
 *
 * - GET /none: no limiter (the module's global guard and interceptor still run and find no policy).
 * - GET /leased: ours, `lease: true`.
 * - GET /exact: ours, the same policy without `lease`.
 * - GET /reference: the minimal guard of http-app.ts (one EVALSHA of the reference script per decision,
 *   and the headers ours writes), on this route only.
 * - GET /rlf: rate-limiter-flexible's guard of http-app.ts (RateLimiterRedis.consume), on this route only.
 *
 * Prints `{"port":n}` once it listens.
 */

const { capacity, refillPerSecond } = LIMITS.allowed;

function leasesModule(prefix: string): DynamicModule {
  @Controller()
  class LeasesController {
    @Get('none')
    none() {
      return BODY;
    }

    @Get('leased')
    @RateLimit({ capacity, refillPerSecond, lease: true })
    leased() {
      return BODY;
    }

    @Get('exact')
    @RateLimit({ capacity, refillPerSecond })
    exact() {
      return BODY;
    }

    @Get('reference')
    @Limited(LIMITS.allowed)
    @UseGuards(minimalGuard(`${prefix}reference:`))
    reference() {
      return BODY;
    }

    @Get('rlf')
    @Limited(LIMITS.allowed)
    @UseGuards(rlfGuard(`${prefix}rlf:`))
    rlf() {
      return BODY;
    }
  }

  @Module({})
  class LeasesAppModule {}
  return {
    module: LeasesAppModule,
    imports: [RateLimitModule.forRoot({ redis: benchRedisUrl(), keyPrefix: `${prefix}ours:` })],
    controllers: [LeasesController],
  };
}

async function main(): Promise<void> {
  const [prefix] = process.argv.slice(2);
  if (!prefix) throw new Error('usage: leases-app.js <key prefix>');
  const app = await NestFactory.create(leasesModule(prefix), { logger: ['error', 'warn'] });
  // close() gives the leases' unspent tokens back.
  process.once('SIGTERM', () => void app.close().finally(() => process.exit(0)));
  await app.listen(0, '127.0.0.1');
  const { port } = app.getHttpServer().address() as AddressInfo;
  process.stdout.write(`${JSON.stringify({ port })}\n`);
}

main().catch((error: unknown) => {
  console.error(error);
  process.exit(1);
});
