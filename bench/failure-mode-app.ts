import 'reflect-metadata';
import type { AddressInfo } from 'node:net';
import { Controller, Get, Module } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { RateLimit, RateLimitModule } from 'nest-redis-rate-limit';
import { FAILURE_MODE, LIMITS } from './settings.js';

/**
 * The app of the failure-mode step: `node --expose-gc dist/bench/failure-mode-app.js <default|open> <redis URL> <key prefix>`.
 * A Nest 12 Express app of ours with the module's default options (`default`: failureMode left unset,
 * so 'local') or the same with `failureMode: 'open'` (the previous default). Routes:
 * - GET /allowed: a limit nobody reaches, per client IP (the HTTP step's /allowed);
 * - GET /limited: FAILURE_MODE.capacity tokens per API key (x-api-key), refilled FAILURE_MODE.refillPerSecond per second;
 * - GET /stats: no limit; a full GC, then `process.memoryUsage()`'s heapUsed and rss, and the decisions so far by source
 *   ('store', 'cache', 'local', 'open'; from onDecision).
 * Prints `{"port":n}` once it listens.
 */

const BODY = { hello: 'world' };
/** Decisions by source since the start. */
const sources: Record<string, number> = {};

@Controller()
class FailureModeController {
  @Get('allowed')
  @RateLimit(LIMITS.allowed.capacity, LIMITS.allowed.refillPerSecond)
  allowed() {
    return BODY;
  }

  @Get('limited')
  @RateLimit({ capacity: FAILURE_MODE.capacity, refillPerSecond: FAILURE_MODE.refillPerSecond, keyBy: 'apiKey' })
  limited() {
    return BODY;
  }

  @Get('stats')
  stats() {
    (globalThis as { gc?: () => void }).gc?.();
    const { heapUsed, rss } = process.memoryUsage();
    return { heapUsed, rss, sources: { ...sources } };
  }
}

async function main(): Promise<void> {
  const [mode, redis, keyPrefix] = process.argv.slice(2);
  if ((mode !== 'default' && mode !== 'open') || !redis || !keyPrefix) {
    throw new Error('usage: failure-mode-app.js <default|open> <redis URL> <key prefix>');
  }
  @Module({
    imports: [
      RateLimitModule.forRoot({
        redis,
        keyPrefix,
        onDecision: (event) => void (sources[event.source] = (sources[event.source] ?? 0) + 1),
        ...(mode === 'open' ? { failureMode: 'open' as const } : {}),
      }),
    ],
    controllers: [FailureModeController],
  })
  class FailureModeAppModule {}
  // No log lines: the start-up error of a Redis that is not there is the same for both and expected.
  const app = await NestFactory.create(FailureModeAppModule, { logger: false });
  process.once('SIGTERM', () => void app.close().finally(() => process.exit(0)));
  await app.listen(0, '127.0.0.1');
  const { port } = app.getHttpServer().address() as AddressInfo;
  process.stdout.write(`${JSON.stringify({ port })}\n`);
}

main().catch((error: unknown) => {
  console.error(error);
  process.exit(1);
});
