import { createHash } from 'node:crypto';
import { performance } from 'node:perf_hooks';
import { Controller, Get, type INestApplication, Logger, Module } from '@nestjs/common';
import type { Redis } from 'ioredis';
import { BucketStore, RateLimit, RateLimitModule, type RedisBucketStore } from 'nest-redis-rate-limit';
import { createApp } from '../../support/app.js';
import { type Answer, sleep, stopAllLoads, timedGet } from '../../support/load.js';
import { LogRecorder } from '../../support/log-recorder.js';
import { testPrefix } from '../../support/redis.js';
import { LocalSentinels } from '../../support/sentinel.js';

/**
 * The figures of docs/guides/redis-sentinel.md, measured: not a test of `npm test` (its file name is
 * no test's), run by `node scripts/sentinel-runs.mjs` (CONTRIBUTING.md), which gives it to jest alone.
 *
 * Each run starts a deployment of its own (a master, a replica, three sentinels: test/support/sentinel.ts),
 * one app with the module's own client (`failureMode: 'closed'`), a load loop that keeps one bucket
 * (B = 10, R = 10 or 20/s) above its rate, and a probe every PROBE_EVERY_MS with a key of its own; then
 * the fault, FAULT_AT_MS after the load starts:
 * - `kill`: SIGKILL of the master. Figure: when decisions reach the new master, after Sentinel's switch
 *   (from the first probe after which every probe was decided there; the probes' keys are looked up on
 *   the new master at the end);
 * - `failover`: `SENTINEL FAILOVER` (graceful). Figures: the switch delay (from the command to
 *   `+switch-master`), the same recovery, and the admissions on the saturated bucket beyond B + R·T
 *   (what the demoted master's lost writes over-admitted).
 * Environment: SENTINEL_KILL_RUNS (default 20), SENTINEL_FAILOVER_RUNS (per rate, default 5).
 */

const CAPACITY = 10;
const RATES = [10, 20] as const;
type Rate = (typeof RATES)[number];
const FAULT_AT_MS = 1500;
const RUN_MS = 8500;
const PROBE_EVERY_MS = 50;
/** The guide's bound: decisions on the new master within this of Sentinel's switch. */
const BOUND_MS = 1000;
const KILL_RUNS = Number(process.env.SENTINEL_KILL_RUNS ?? 20);
const FAILOVER_RUNS = Number(process.env.SENTINEL_FAILOVER_RUNS ?? 5);

@Controller('m')
class MeasuredController {
  @Get('r10')
  @RateLimit({ capacity: CAPACITY, refillPerSecond: 10, keyBy: 'apiKey' })
  r10() {
    return { ok: true };
  }

  @Get('r20')
  @RateLimit({ capacity: CAPACITY, refillPerSecond: 20, keyBy: 'apiKey' })
  r20() {
    return { ok: true };
  }

  @Get('probe')
  @RateLimit({ capacity: 1000, refillPerSecond: 1, keyBy: 'apiKey' })
  probe() {
    return { ok: true };
  }
}

const keyOf = (prefix: string, apiKey: string) =>
  `${prefix}{key:${createHash('sha256').update(apiKey).digest('hex').slice(0, 32)}}:MeasuredController.probe`;
const decided = (a: Answer) => a.status === 200 && a.remaining !== null;

type Fault = 'kill' | 'failover';

interface Run {
  fault: Fault;
  rate: Rate;
  switchMs: number;
  recoveryMs: number;
  admitted: number;
  seconds: number;
  beyond: number;
  line: string | undefined;
  /** The client's events from the fault on (ms after it), and the run's RateLimit lines: printed for a run past the bound. */
  timeline: string[];
}

const recorder = new LogRecorder();

async function once(fault: Fault, rate: Rate, n: number): Promise<Run | string> {
  const d = await LocalSentinels.start();
  let app: INestApplication | undefined;
  const events = d.watch();
  try {
    const prefix = testPrefix(`sentinel-runs-${fault}-${rate}-${n}`);
    @Module({
      imports: [RateLimitModule.forRoot({ redis: d.options, keyPrefix: prefix, failureMode: 'closed' })],
      controllers: [MeasuredController],
    })
    class MeasuredModule {}
    app = await createApp(MeasuredModule, 'express', (a) => a.useLogger(recorder));
    await app.listen(0, '127.0.0.1');
    const url = `${await app.getUrl()}`.replace('[::1]', '127.0.0.1');
    const oldPort = d.master.port;
    const timeline: string[] = [];
    let faultAt = Infinity;
    const client = (app.get(BucketStore) as RedisBucketStore).client as Redis;
    for (const event of ['connecting', 'connect', 'ready', 'close', 'reconnecting', 'end', 'error']) {
      client.on(event, (arg: unknown) => {
        const detail = arg instanceof Error ? arg.message : arg === undefined ? '' : String(arg);
        timeline.push(`${(performance.now() - faultAt).toFixed(0)} ms ${event} ${detail}`.trim());
      });
    }
    const until = performance.now() + RUN_MS;
    const load: Answer[] = [];
    const probes: { key: string; sentAt: number; answer: Answer }[] = [];
    const pause = 25;
    const loop = async () => {
      while (performance.now() < until) {
        load.push(await timedGet(`${url}/m/r${rate}`, { 'x-api-key': 'load' }));
        await sleep(pause);
      }
    };
    const probing = async () => {
      for (let i = 0; performance.now() < until; i++) {
        const apiKey = `probe-${i}`;
        const sentAt = performance.now();
        void timedGet(`${url}/m/probe`, { 'x-api-key': apiKey }).then((answer) =>
          probes.push({ key: keyOf(prefix, apiKey), sentAt, answer }),
        );
        await sleep(PROBE_EVERY_MS);
      }
    };
    // One loop of about 2·R + 10 requests/s per 10/s of rate: the bucket stays above its rate.
    const driven = Promise.all([...Array.from({ length: rate / 10 }, loop), probing()]);
    await sleep(FAULT_AT_MS);
    faultAt = performance.now();
    if (fault === 'kill') d.master.signal('SIGKILL');
    else await d.failover();
    await driven;
    await sleep(300);
    const switchAt = events.seen.get('+switch-master');
    const newPort = await d.masterPort();
    const ours = () =>
      recorder.lines
        .filter((l) => l.context === 'RateLimit' && l.message.includes(`via sentinels 127.0.0.1:${d.sentinels[0].port},`))
        .map((l) => l.message);
    if (switchAt === undefined || newPort === oldPort) return `Sentinel did not switch within ${RUN_MS - FAULT_AT_MS} ms`;
    const onNew = await d.ask(newPort, (master) => Promise.all(probes.map((p) => master.exists(p.key))));
    const judged = probes
      .map((p, i) => ({ sentAt: p.sentAt, onNew: onNew[i] === 1 && decided(p.answer) }))
      .sort((a, b) => a.sentAt - b.sentAt);
    let from = judged.length;
    while (from > 0 && judged[from - 1].onNew) from--;
    const first = Math.min(...load.map((a) => a.startedAt));
    const last = Math.max(...load.map((a) => a.endedAt));
    const seconds = (last - first) / 1000;
    const admitted = load.filter(decided).length;
    return {
      fault,
      rate,
      switchMs: switchAt - faultAt,
      recoveryMs: from < judged.length ? judged[from].sentAt - switchAt : Infinity,
      admitted,
      seconds,
      beyond: Math.max(0, admitted - Math.floor(CAPACITY + rate * seconds)),
      line: ours().find((l) => l.includes('now deciding on')),
      timeline: [...timeline.map((t) => `client: ${t}`), ...ours().map((l) => `log: ${l}`)],
    };
  } finally {
    events.stop();
    await app?.close().catch(() => undefined);
    await d.stop();
  }
}

async function measured(fault: Fault, rate: Rate, n: number): Promise<Run> {
  for (let tries = 1; ; tries++) {
    const run = await once(fault, rate, n * 10 + tries);
    if (typeof run !== 'string') return run;
    process.stdout.write(`[again] ${fault} R=${rate} run ${n + 1}: ${run}\n`);
    if (tries === 3) throw new Error(`${fault} R=${rate} run ${n + 1}: ${run}`);
  }
}

const span = (values: number[], digits = 0) =>
  values.length === 0 ? '-' : `${Math.min(...values).toFixed(digits)}–${Math.max(...values).toFixed(digits)}`;

describe('Sentinel figures', () => {
  beforeAll(() => Logger.overrideLogger(recorder));
  afterAll(() => {
    Logger.overrideLogger(false);
    stopAllLoads();
  });

  it(`kill: decisions on the new master within ${BOUND_MS} ms of the switch, ${KILL_RUNS} runs`, async () => {
    const runs: Run[] = [];
    for (let n = 0; n < KILL_RUNS; n++) {
      const run = await measured('kill', 10, n);
      runs.push(run);
      process.stdout.write(
        `[run] kill ${n + 1}/${KILL_RUNS}: switch ${run.switchMs.toFixed(0)} ms after the kill, decisions on the new master ` +
          `${run.recoveryMs.toFixed(0)} ms after the switch\n`,
      );
      if (run.recoveryMs > BOUND_MS) process.stdout.write(`      ${run.timeline.join('\n      ')}\n`);
    }
    const within = runs.filter((r) => r.recoveryMs <= BOUND_MS).length;
    process.stdout.write(
      `[summary] kill: ${within} of ${runs.length} within ${BOUND_MS} ms; after the switch ${span(runs.map((r) => r.recoveryMs))} ms ` +
        `(sorted: ${runs
          .map((r) => r.recoveryMs)
          .sort((a, b) => a - b)
          .map((v) => v.toFixed(0))
          .join(', ')}); switch after the kill ${span(
          runs.map((r) => r.switchMs / 1000),
          1,
        )} s\n`,
    );
    expect(within).toBe(runs.length);
  }, 3_600_000);

  it.each(RATES)(
    `failover at R = %i/s: switch delay, recovery and admissions beyond B + R·T, ${FAILOVER_RUNS} runs`,
    async (rate) => {
      const runs: Run[] = [];
      for (let n = 0; n < FAILOVER_RUNS; n++) {
        const run = await measured('failover', rate, n);
        runs.push(run);
        const bound = rate * ((run.switchMs + run.recoveryMs) / 1000);
        process.stdout.write(
          `[run] failover R=${rate} ${n + 1}/${FAILOVER_RUNS}: switch ${run.switchMs.toFixed(0)} ms after SENTINEL FAILOVER, decisions ` +
            `on the new master ${run.recoveryMs.toFixed(0)} ms after it; admitted ${run.admitted} in ${run.seconds.toFixed(2)} s ` +
            `(B + R·T = ${(CAPACITY + rate * run.seconds).toFixed(1)}): ${run.beyond} beyond; R × (switch delay + recovery) = ${bound.toFixed(1)}\n` +
            `      ${run.line ?? '(no "now deciding on" line)'}\n`,
        );
      }
      process.stdout.write(
        `[summary] failover R=${rate}: switch ${span(runs.map((r) => r.switchMs))} ms after SENTINEL FAILOVER; decisions on the new ` +
          `master ${span(runs.map((r) => r.recoveryMs))} ms after the switch; beyond B + R·T ${span(runs.map((r) => r.beyond))}; ` +
          `R × (switch delay + bound) = ${span(
            runs.map((r) => rate * ((r.switchMs + BOUND_MS) / 1000)),
            1,
          )}\n`,
      );
      for (const run of runs) expect(run.beyond).toBeLessThanOrEqual(Math.ceil(rate * ((run.switchMs + BOUND_MS) / 1000)));
    },
    3_600_000,
  );
});
