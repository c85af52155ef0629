import 'reflect-metadata';
import type { AddressInfo } from 'node:net';
import { monitorEventLoopDelay, performance } from 'node:perf_hooks';
import { Controller, Get, Module } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import type { NestExpressApplication } from '@nestjs/platform-express';
import { RateLimit, RateLimitModule, type RateLimitDecisionEvent } from 'nest-redis-rate-limit';
import { benchRedisUrl, STARVED } from './settings.js';

/**
 * The app of the starved step: `node dist/bench/starved-app.js <key prefix>`, forked with IPC by
 * starved-step.ts. A Nest 12 Express app with the module's DEFAULT options (failureMode 'open',
 * timeoutMs 100, deny cache and coalescing on; only the Redis URL and the run's key prefix are set),
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

/** The stats reply: the counts, and when (epoch ms) each decision without a store answer was made. */
export interface StarvedAppReply {
  stats: StarvedAppStats;
  failedAt: number[];
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

async function main(): Promise<void> {
  const prefix = process.argv[2];
  if (!prefix || !process.send) throw new Error('starved-app.js is started by the bench (starved-step.ts)');
  @Module({
    imports: [RateLimitModule.forRoot({ redis: benchRedisUrl(), keyPrefix: prefix, onDecision: count })],
    controllers: [StarvedController],
  })
  class StarvedAppModule {}
  const app = await NestFactory.create<NestExpressApplication>(StarvedAppModule, { logger: ['error'] });
  app.set('trust proxy', true);
  process.on('message', (message: StarvedAppMessage) => {
    if (message.type === 'reset') {
      bySource = {};
      admittedBySource = {};
      decided = new Map();
      failedAt = [];
      loopDelay.reset();
      process.send!({ type: 'reset' });
    } else if (message.type === 'stats') {
      const reply: StarvedAppReply = { stats: stats(message.boundPerIdentity), failedAt };
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
