import 'reflect-metadata';
import { createRequire } from 'node:module';
import type { AddressInfo } from 'node:net';
import { dirname, join } from 'node:path';
import { monitorEventLoopDelay, performance } from 'node:perf_hooks';
import { Controller, Get, Module } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import type { NestExpressApplication } from '@nestjs/platform-express';
import { RateLimit, RateLimitModule, type RateLimitDecisionEvent } from 'nest-redis-rate-limit';
import { benchRedisUrl, STARVED } from './settings.js';

/**
 * The app of the starved step: `node dist/bench/starved-app.js <key prefix>`, forked with IPC by
 * starved-step.ts. A Nest 12 Express app with the module's default options but failureMode 'open' (the
 * previous default; timeoutMs 100, deny cache and coalescing on; the Redis URL and the run's key prefix set),
 * trust proxy on, and one route: GET /limited, a bucket of STARVED.capacity per client IP (the
 * X-Forwarded-For address). Its onDecision listener counts every decision by source and outcome, and
 * the admissions per identity. Over IPC: `reset` starts a phase (counters and the event-loop delay
 * histogram cleared), `stats` answers the phase's counts. Sends `{ port }` once it listens.
 */

export type StarvedAppMessage = { type: 'reset' } | { type: 'stats'; boundPerIdentity: number };

export interface StarvedAppStats {
  decisions: number;
  /** Decisions by source ('store', 'cache', 'open', 'closed', 'local'). */
  bySource: Record<string, number>;
  /** Admissions (outcome 'allowed') by source: the 'open' ones were admitted without a decision. */
  admittedBySource: Record<string, number>;
  admitted: number;
  /** Identities that had at least one decision. */
  identities: number;
  /** The most admissions one identity got in the phase. */
  maxAdmittedPerIdentity: number;
  /** Identities admitted more than the bound (capacity + refill·t, floored). */
  identitiesOverPromise: number;
  /** Σ over identities of max(0, admitted − bound). */
  admittedBeyondPromise: number;
  /** The app's own event-loop delay over the phase (monitorEventLoopDelay, 10 ms resolution), ms. */
  loopDelayP50Ms: number;
  loopDelayP99Ms: number;
  loopDelayMaxMs: number;
}

/**
 * The stats reply: the counts; when (epoch ms) each decision without a store answer was made; and when
 * each store call failed (a timeout, or an error from Redis): the decisions that asked Redis and got no
 * answer in time. The other 'open' ones were not sent at all, because the breaker was open.
 */
export interface StarvedAppReply {
  stats: StarvedAppStats;
  failedAt: number[];
  /** [queued, failed] epoch ms: from the decision asked for (the hook's start) to its failure. */
  storeFailed: [number, number][];
}

@Controller()
class StarvedController {
  @Get('limited')
  @RateLimit(STARVED.capacity, STARVED.refillPerSecond)
  limited() {
    return { ok: true };
  }
}

let bySource: Record<string, number> = {};
let admittedBySource: Record<string, number> = {};
let decided = new Map<string, number>();
let failedAt: number[] = [];
let storeFailed: [number, number][] = [];
const epochNow = () => performance.timeOrigin + performance.now();
const loopDelay = monitorEventLoopDelay({ resolution: 10 });

function count(event: RateLimitDecisionEvent): void {
  bySource[event.source] = (bySource[event.source] ?? 0) + 1;
  if (event.source !== 'store' && event.source !== 'cache') failedAt.push(epochNow());
  const ip = String((event.context.switchToHttp().getRequest() as { ip?: string }).ip);
  const admitted = decided.get(ip) ?? 0;
  if (event.outcome === 'allowed') {
    admittedBySource[event.source] = (admittedBySource[event.source] ?? 0) + 1;
    decided.set(ip, admitted + 1);
  } else if (!decided.has(ip)) {
    decided.set(ip, 0);
  }
}

function stats(bound: number): StarvedAppStats {
  let max = 0;
  let over = 0;
  let beyond = 0;
  for (const admitted of decided.values()) {
    max = Math.max(max, admitted);
    if (admitted > bound) {
      over++;
      beyond += admitted - bound;
    }
  }
  const ms = (ns: number) => Math.round(ns / 1e4) / 100;
  return {
    decisions: Object.values(bySource).reduce((a, b) => a + b, 0),
    bySource,
    admittedBySource,
    admitted: Object.values(admittedBySource).reduce((a, b) => a + b, 0),
    identities: decided.size,
    maxAdmittedPerIdentity: max,
    identitiesOverPromise: over,
    admittedBeyondPromise: beyond,
    loopDelayP50Ms: ms(loopDelay.percentile(50)),
    loopDelayP99Ms: ms(loopDelay.percentile(99)),
    loopDelayMaxMs: ms(loopDelay.max),
  };
}

/**
 * The module's internal event hub, where the metrics learn of every store call (ok, or failed: a timeout
 * or an error). Not public API: the bench loads the class from the package's own CommonJS build, the one
 * module instance its ESM entry re-exports, so DI finds the provider the module registered.
 */
interface StoreCallHub {
  onStoreCall(listener: (event: { durationMs: number; outcome: 'ok' | 'error' }) => void): void;
}
function storeEventsClass(): new () => StoreCallHub {
  const require = createRequire(import.meta.url);
  const root = dirname(require.resolve('nest-redis-rate-limit/package.json'));
  return (require(join(root, 'dist/cjs/events/rate-limit-events.js')) as { RateLimitEvents: new () => StoreCallHub }).RateLimitEvents;
}

async function main(): Promise<void> {
  const prefix = process.argv[2];
  if (!prefix || !process.send) throw new Error('starved-app.js is started by the bench (starved-step.ts)');
  @Module({
    // failureMode 'open' (the previous default) set explicitly: a decision Redis did not answer in time is then an admission
    // without a decision, what this step counts; under the default 'local' the in-process bucket would decide it.
    imports: [RateLimitModule.forRoot({ redis: benchRedisUrl(), keyPrefix: prefix, failureMode: 'open', onDecision: count })],
    controllers: [StarvedController],
  })
  class StarvedAppModule {}
  // BENCH_STARVED_WARN=1: the module's warnings too (what failed, when the breaker opens and closes).
  const logger = process.env.BENCH_STARVED_WARN === '1' ? (['error', 'warn'] as const) : (['error'] as const);
  const app = await NestFactory.create<NestExpressApplication>(StarvedAppModule, { logger: [...logger] });
  app.set('trust proxy', true);
  app.get(storeEventsClass(), { strict: false }).onStoreCall((event) => {
    if (event.outcome !== 'error') return;
    const at = epochNow();
    storeFailed.push([at - event.durationMs, at]);
  });
  process.on('message', (message: StarvedAppMessage) => {
    if (message.type === 'reset') {
      bySource = {};
      admittedBySource = {};
      decided = new Map();
      failedAt = [];
      storeFailed = [];
      loopDelay.reset();
      process.send!({ type: 'reset' });
    } else if (message.type === 'stats') {
      const reply: StarvedAppReply = { stats: stats(message.boundPerIdentity), failedAt, storeFailed };
      process.send!({ type: 'stats', ...reply });
    }
  });
  process.once('disconnect', () => process.exit(0));
  await app.listen(0, '127.0.0.1');
  loopDelay.enable();
  const { port } = app.getHttpServer().address() as AddressInfo;
  process.send({ port });
}

main().catch((error: unknown) => {
  console.error(error);
  process.exit(1);
});
