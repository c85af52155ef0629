import type { Redis } from 'ioredis';
import type { AcquireReply } from './acquire-worker.js';
import { forkWorker, nextMessage, progress, stopChild } from './processes.js';
import { commandStats, scriptCost } from './redis.js';
import { ACQUIRE } from './settings.js';
import { maxInWindow, round } from './stats.js';

/**
 * The acquire step (issue 23): ACQUIRE.processes processes all want as many grants as they can from
 * one bucket, through ours (`BucketService.acquire()`: one reservation per grant, then a timer) and
 * through rate-limiter-flexible's `RateLimiterQueue` over `RateLimiterRedis` (a queue per process that
 * retries `consume()` on a timer when the window is spent), one after the other on the run's Redis.
 * Reported per waiter: grants per second over the measured seconds (against R), Redis calls per grant
 * (the commands its clients sent; the script calls of INFO commandstats beside), each process's
 * share of the grants, and the most grants in any window of t against B + R·t. Nothing is asserted.
 */

export const ACQUIRE_WAITERS = ['ours', 'rlf-queue'] as const;
export type AcquireWaiter = (typeof ACQUIRE_WAITERS)[number];

export interface AcquireRun {
  waiter: AcquireWaiter;
  /** What it promises, in its own terms. */
  promise: string;
  grants: number;
  grantsPerSecond: number;
  errors: number;
  /** Commands the processes sent (their clients' sendCommand), and per grant. */
  redisCalls: number;
  redisCallsPerGrant: number;
  scriptCallsPerGrant: number;
  scriptUsecPerCall: number;
  /** Each process's share of the grants in the measured seconds (%), in process order. */
  sharesPercent: number[];
  /** The most grants in any window of these lengths (ms), and B + R·t for it. */
  windows: { ms: number; most: number; bound: number }[];
  /** The largest (grants in a window) − (B + R·t) over every window between two grants. */
  worstExcess: number;
}

export interface AcquireResult {
  settings: typeof ACQUIRE;
  method: string;
  runs: AcquireRun[];
}

export const acquirePlannedSeconds = () => ACQUIRE_WAITERS.length * (ACQUIRE.seconds + 4);

const WINDOWS_MS = [50, 100, 1000];

async function runWaiter(redis: Redis, runPrefix: string, waiter: AcquireWaiter): Promise<AcquireRun> {
  const prefix = `${runPrefix}acq-${waiter}:`;
  const key = 'shared';
  const workers = Array.from({ length: ACQUIRE.processes }, () => forkWorker('acquire-worker.js', [waiter, prefix, key]));
  try {
    await Promise.all(workers.map((w) => nextMessage(w, `an acquire worker (${waiter}) to be ready`, 30_000)));
    const before = await commandStats(redis);
    const goAt = Date.now() + 300;
    const replies = await Promise.all(
      workers.map((w) => {
        const reply = nextMessage<AcquireReply>(w, `the grants of an acquire worker (${waiter})`, (ACQUIRE.seconds + 60) * 1000);
        w.send({ goAt });
        return reply;
      }),
    );
    const after = await commandStats(redis);
    const end = goAt + ACQUIRE.seconds * 1000;
    const inRun = replies.map((r) => r.grants.filter((t) => t >= goAt && t < end).length);
    const measured = inRun.reduce((a, b) => a + b, 0);
    const all = replies.flatMap((r) => r.grants).sort((a, b) => a - b);
    const grants = all.length;
    const { capacity: B, refillPerSecond: R } = ACQUIRE;
    let worst = -Infinity;
    for (let i = 0; i < all.length; i++) {
      for (let j = i; j < all.length; j++) worst = Math.max(worst, j - i + 1 - (B + (R * (all[j] - all[i])) / 1000));
    }
    const script = scriptCost(before, after);
    const calls = replies.reduce((a, r) => a + r.commands, 0);
    const firstError = replies.find((r) => r.firstError)?.firstError;
    if (firstError) console.warn(`[acquire] ${waiter}: first error: ${firstError}`);
    return {
      waiter,
      promise:
        waiter === 'ours'
          ? `token bucket, burst ${B}, ${R}/s: at most ${B} + ${R}·t in any t seconds`
          : `fixed window of ${R} per 1 s (RateLimiterRedis' duration is whole seconds): at most ${R} per window, ${2 * R} in any second across a boundary`,
      grants,
      grantsPerSecond: round(measured / ACQUIRE.seconds, 1),
      errors: replies.reduce((a, r) => a + r.errors, 0),
      redisCalls: calls,
      redisCallsPerGrant: round(calls / Math.max(1, grants), 2),
      scriptCallsPerGrant: round(script.calls / Math.max(1, grants), 2),
      scriptUsecPerCall: round(script.usec / Math.max(1, script.calls), 1),
      sharesPercent: inRun.map((n) => round((100 * n) / Math.max(1, measured), 1)),
      windows: WINDOWS_MS.map((ms) => ({ ms, most: maxInWindow(all, ms), bound: Math.floor(B + (R * ms) / 1000) })),
      worstExcess: round(worst, 2),
    };
  } finally {
    await Promise.all(workers.map((w) => stopChild(w, 'SIGKILL')));
  }
}

export async function acquireStep(redis: Redis, runPrefix: string): Promise<AcquireResult> {
  const runs: AcquireRun[] = [];
  for (const waiter of ACQUIRE_WAITERS) {
    const t = Date.now();
    const run = await runWaiter(redis, runPrefix, waiter);
    runs.push(run);
    progress(
      `acquire ${waiter}`,
      `${run.grantsPerSecond} grants/s, ${run.redisCallsPerGrant} Redis calls per grant, shares ${run.sharesPercent.join('/')} %`,
      Date.now() - t,
      ACQUIRE.seconds + 4,
    );
  }
  return {
    settings: { ...ACQUIRE },
    method:
      `${ACQUIRE.processes} processes × ${ACQUIRE.inFlight} callers, each asking again as soon as it is granted, for ${ACQUIRE.seconds} s on one key ` +
      `(B = ${ACQUIRE.capacity}, R = ${ACQUIRE.refillPerSecond}/s); grant times are when the caller's promise resolved (epoch ms of each process). ` +
      'Grants per second: grants inside the measured seconds. Redis calls per grant: the commands the processes sent (counted at their ioredis ' +
      "clients' sendCommand) from the start until each one's last grant, divided by every grant (calls still waiting at the end are granted " +
      "after it); script calls and their µs: INFO commandstats (EVALSHA/EVAL) over the same run. Shares: each process's grants inside " +
      'the measured seconds. Windows: the most grants in any window of that length, between any two grant times.',
    runs,
  };
}

export function renderAcquire(result: AcquireResult, heading: string): string {
  const { capacity: B, refillPerSecond: R, processes, inFlight, seconds } = result.settings;
  const names: Record<AcquireWaiter, string> = { ours: '**ours** (`acquire()`)', 'rlf-queue': 'rate-limiter-flexible `RateLimiterQueue`' };
  const row = (label: string, cell: (run: AcquireRun) => string) => `| ${label} | ${result.runs.map(cell).join(' | ')} |`;
  return [
    `${heading} Acquire: ${processes} processes × ${inFlight} waiting callers on one bucket (B = ${B}, R = ${R}/s), ${seconds} s`,
    '',
    `| | ${result.runs.map((run) => names[run.waiter]).join(' | ')} |`,
    `|---|${result.runs.map(() => '---:').join('|')}|`,
    row('promise', (run) => run.promise),
    row(`grants per second (R = ${R})`, (run) => String(run.grantsPerSecond)),
    row(
      'Redis calls per grant',
      (run) => `${run.redisCallsPerGrant} (script calls ${run.scriptCallsPerGrant}, ${run.scriptUsecPerCall} µs each)`,
    ),
    row("each process's share (%)", (run) => run.sharesPercent.join(' / ')),
    ...WINDOWS_MS.map((ms) =>
      row(`most grants in any ${ms} ms (B + R·t = ${Math.floor(B + (R * ms) / 1000)})`, (run) =>
        String(run.windows.find((w) => w.ms === ms)!.most),
      ),
    ),
    row('worst window over B + R·t (grants)', (run) => String(run.worstExcess)),
    row('errors', (run) => String(run.errors)),
    '',
    result.method,
    '',
  ].join('\n');
}
