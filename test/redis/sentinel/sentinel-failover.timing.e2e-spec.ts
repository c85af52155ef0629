import { createHash } from 'node:crypto';
import { performance } from 'node:perf_hooks';
import { Controller, Get, type INestApplication, Module } from '@nestjs/common';
import { RateLimit, RateLimitModule } from 'nest-redis-rate-limit';
import { createApp } from '../../support/app.js';
import { type Answer, sleep, stopAllLoads, timedGet } from '../../support/load.js';
import { LogRecorder } from '../../support/log-recorder.js';
import { watchLoopDelay } from '../../support/loop-delay.js';
import { testPrefix } from '../../support/redis.js';
import { LocalSentinels } from '../../support/sentinel.js';

/**
 * Redis Sentinel failover under load (docs/guides/redis-sentinel.md): a master, a replica and three
 * sentinels of the test's own (test/support/sentinel.ts), and two apps at once on them, one per
 * failureMode ('open', 'closed'), each with the module's own client (`redis: { sentinels, name }`).
 * Per scenario — the master SIGKILLed, frozen by SIGSTOP, or a graceful `SENTINEL FAILOVER` — each app:
 * - decides on the new master within RECOVERY_BOUND_MS of Sentinel's `+switch-master`, and on it only
 *   from then on (probes with keys of their own, looked up on the new master at the end);
 * - admits no more than B + R·T + the documented loss on one saturated bucket over the run;
 * - says in one log line that it now decides on the new master; and needs no restart.
 */

const CAPACITY = 10;
const REFILL = 10;
const SCOPE = 'SentinelController.limited';
/** The fault comes this long after the load starts; the run lasts RUN_MS in all. */
const FAULT_AT_MS = 1500;
const RUN_MS = 8500;
const PROBE_EVERY_MS = 100;
/** What docs/guides/redis-sentinel.md promises: decisions on the new master within this of `+switch-master`. */
const RECOVERY_BOUND_MS = 1000;
/** What docs/explanation/exactness.md allows a failover to over-admit on one bucket, in seconds of refill, plus one. */
const LOSS_SECONDS = 1.5;
/** A switch later than this after the fault is Sentinel's (or the machine's) slowness, not the library's: inconclusive. */
const SWITCH_LIMIT_MS = { kill: 6000, freeze: 6000, failover: 3000 };

@Controller('limited')
class SentinelController {
  @Get()
  @RateLimit({ capacity: CAPACITY, refillPerSecond: REFILL, keyBy: 'apiKey' })
  limited() {
    return { ok: true };
  }

  /** A token per probe, each with a key of its own that outlives the test: where it was decided is visible after. */
  @Get('probe')
  @RateLimit({ capacity: 1000, refillPerSecond: 1, keyBy: 'apiKey' })
  probe() {
    return { ok: true };
  }
}

const keyOf = (prefix: string, apiKey: string, scope: string) =>
  `${prefix}{key:${createHash('sha256').update(apiKey).digest('hex').slice(0, 32)}}:${scope}`;

type Fault = 'kill' | 'freeze' | 'failover';
const MODES = ['open', 'closed'] as const;

interface Probe {
  key: string;
  sentAt: number;
  answer: Answer;
}

interface AppRun {
  mode: (typeof MODES)[number];
  prefix: string;
  load: Answer[];
  probes: Probe[];
}

async function startApp(deployment: LocalSentinels, mode: 'open' | 'closed', prefix: string, recorder: LogRecorder) {
  @Module({
    imports: [RateLimitModule.forRoot({ redis: deployment.options, keyPrefix: prefix, failureMode: mode })],
    controllers: [SentinelController],
  })
  class SentinelAppModule {}
  const app = await createApp(SentinelAppModule, 'express', (a) => a.useLogger(recorder));
  await app.listen(0, '127.0.0.1');
  return { app, url: `${await app.getUrl()}`.replace('[::1]', '127.0.0.1') };
}

/** Drives `url`'s saturated bucket with `workers` loops and sends a probe every PROBE_EVERY_MS, until `until`. */
async function drive(url: string, mode: AppRun['mode'], prefix: string, until: number, workers = 2): Promise<AppRun> {
  const run: AppRun = { mode, prefix, load: [], probes: [] };
  const loop = async () => {
    while (performance.now() < until) {
      run.load.push(await timedGet(`${url}/limited`, { 'x-api-key': 'load' }));
      await sleep(15);
    }
  };
  const probes = async () => {
    for (let n = 0; performance.now() < until; n++) {
      const apiKey = `probe-${n}`;
      const sentAt = performance.now();
      void timedGet(`${url}/limited/probe`, { 'x-api-key': apiKey }).then((answer) =>
        run.probes.push({ key: keyOf(prefix, apiKey, `${SCOPE.split('.')[0]}.probe`), sentAt, answer }),
      );
      await sleep(PROBE_EVERY_MS);
    }
  };
  await Promise.all([...Array.from({ length: workers }, loop), probes()]);
  await sleep(300); // the last probes' answers
  return run;
}

/** Prints a measured figure when RL_TEST_FIGURES is set, silent otherwise. */
const figure = (label: string, value: string) => {
  if (process.env.RL_TEST_FIGURES) process.stdout.write(`[figure] ${label}: ${value}\n`);
};

const decided = (a: Answer) => a.status === 200 && a.remaining !== null;

describe.each<Fault>(['kill', 'freeze', 'failover'])('Sentinel failover: %s', (fault) => {
  let deployment: LocalSentinels | undefined;
  const apps: INestApplication[] = [];
  const recorder = new LogRecorder();

  afterEach(async () => {
    stopAllLoads();
    await Promise.allSettled(apps.splice(0).map((app) => app.close()));
    await deployment?.stop();
    deployment = undefined;
  });

  it(`decides on the new master within ${RECOVERY_BOUND_MS} ms of Sentinel's switch, in 'open' and 'closed', within B + R·T + ${LOSS_SECONDS} s of refill`, async () => {
    const attempt = async (n: number): Promise<string | undefined> => {
      recorder.clear();
      deployment = await LocalSentinels.start();
      const d = deployment;
      const prefixes = MODES.map((mode) => testPrefix(`sentinel-${fault}-${mode}-${n}`));
      const started = await Promise.all(MODES.map((mode, i) => startApp(d, mode, prefixes[i], recorder)));
      apps.push(...started.map((s) => s.app));
      const oldPort = d.master.port;
      const events = d.watch();
      const loop = watchLoopDelay();
      const t0 = performance.now();
      const until = t0 + RUN_MS;
      const runs = Promise.all(started.map((s, i) => drive(s.url, MODES[i], prefixes[i], until)));
      await sleep(FAULT_AT_MS);
      const faultAt = performance.now();
      if (fault === 'kill') d.master.signal('SIGKILL');
      else if (fault === 'freeze') d.master.signal('SIGSTOP');
      else await d.failover();
      const results = await runs;
      loop.stop();
      events.stop();
      const switchAt = events.seen.get('+switch-master');
      const newPort = await d.masterPort();
      if (switchAt === undefined || newPort === oldPort) return `Sentinel did not switch within ${RUN_MS - FAULT_AT_MS} ms`;
      const switchMs = switchAt - faultAt;
      if (switchMs > SWITCH_LIMIT_MS[fault]) return `Sentinel switched ${switchMs.toFixed(0)} ms after the fault`;

      const verdicts = await d.ask(newPort, async (master) =>
        Promise.all(
          results.map(async (run) => {
            const onNew = await Promise.all(run.probes.map((p) => master.exists(p.key)));
            const probes = run.probes.map((p, i) => ({ ...p, onNew: onNew[i] === 1 && decided(p.answer) }));
            probes.sort((a, b) => a.sentAt - b.sentAt);
            // From the first probe after which every probe was decided on the new master.
            let from = probes.length;
            while (from > 0 && probes[from - 1].onNew) from--;
            const recoveredAt = from < probes.length ? probes[from].sentAt : Infinity;
            const first = Math.min(...run.load.map((a) => a.startedAt));
            const last = Math.max(...run.load.map((a) => a.endedAt));
            const seconds = (last - first) / 1000;
            const admitted = run.load.filter(decided).length;
            return { mode: run.mode, recoveryMs: recoveredAt - switchAt, admitted, seconds, tail: probes.length - from };
          }),
        ),
      );
      const worstLoop = loop.worst();
      for (const v of verdicts) {
        figure(
          `${fault}/${v.mode} run ${n + 1}`,
          `switch ${switchMs.toFixed(0)} ms after the fault, decisions on the new master ${v.recoveryMs.toFixed(0)} ms after it ` +
            `(${v.tail} probes); admitted ${v.admitted} in ${v.seconds.toFixed(2)} s (B + R·T = ${(CAPACITY + REFILL * v.seconds).toFixed(1)}); ` +
            `worst loop delay ${worstLoop.toFixed(0)} ms`,
        );
      }
      const late = verdicts.filter((v) => v.recoveryMs > RECOVERY_BOUND_MS);
      // A recovery late by less than the loop's own worst delay cannot be judged: the machine may explain it.
      if (late.length > 0 && late.every((v) => v.recoveryMs <= RECOVERY_BOUND_MS + worstLoop && worstLoop > 100)) {
        return `recovery over the bound with a loop delay of ${worstLoop.toFixed(0)} ms`;
      }
      expect(verdicts.map((v) => [v.mode, v.recoveryMs <= RECOVERY_BOUND_MS])).toEqual(MODES.map((m) => [m, true]));
      for (const v of verdicts) {
        expect(v.admitted).toBeLessThanOrEqual(CAPACITY + REFILL * (v.seconds + LOSS_SECONDS) + 1);
      }
      // One line per app: where it decides now, and how many decisions the old master answered after the
      // failover began. Those are what the failover can cost: every admission beyond B + R·T is one of them.
      const switched = recorder.of('RateLimit', 'log').filter((line) => line.includes(`now deciding on 127.0.0.1:${newPort}`));
      expect(switched).toHaveLength(MODES.length);
      const counted = switched.map((line) => Number(/; (\d+) decision\(s\) were made on/.exec(line)?.[1] ?? 0));
      const beyond = verdicts.map((v) => Math.max(0, v.admitted - Math.floor(CAPACITY + REFILL * v.seconds)));
      figure(`${fault} run ${n + 1}: admissions beyond B + R·T per app, decisions counted on the old master`, `${beyond}; ${counted}`);
      for (const line of switched) figure(`${fault} run ${n + 1}: log`, line);
      expect(beyond.reduce((a, b) => a + b, 0)).toBeLessThanOrEqual(counted.reduce((a, b) => a + b, 0) + MODES.length);
      return undefined;
    };
    const first = await attempt(0);
    if (first === undefined) return;
    process.stdout.write(`[inconclusive] ${fault}: ${first}; trying once more\n`);
    await Promise.allSettled(apps.splice(0).map((app) => app.close()));
    await deployment?.stop();
    const second = await attempt(1);
    if (second !== undefined) throw new Error(`${fault}: inconclusive twice: ${first}; ${second}`);
  }, 60_000);
});
