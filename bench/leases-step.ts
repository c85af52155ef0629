import { spawn } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { Agent, get as httpGet } from 'node:http';
import { basename, join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { createInterface } from 'node:readline';
import { setTimeout as sleep } from 'node:timers/promises';
import autocannon from 'autocannon';
import type { Redis } from 'ioredis';
import { colorOf, escape, type Line, num, panel, type Row, spreadText, svgDocument, upper } from './chart.js';
import { processCpuSeconds } from './http-step.js';
import { fmt, HERE, progress, rotate, stopChild, track } from './processes.js';
import { commandStats, redisCpuSeconds, scanKeys, scriptCost } from './redis.js';
import { LABELS, LEASES, LIMITS } from './settings.js';
import { judge, quantile, round, type Spread, spreadOf, type Verdict } from './stats.js';

/**
 * The leases step (issue 35, item 3): the figure leases exist for. One hot key, LEASES.processes app
 * processes (leases-app.ts: one route per variant; every request comes from 127.0.0.1, so all the
 * processes decide one bucket per route), autocannon from this process (one instance per app process,
 * all at once). The bucket (capacity 1e9, refill 1e9/s) allows every decision: the figures are the cost
 * of deciding, not of refusing.
 *
 * Variants (routes): no limiter (the latency baseline), ours leased (`lease: true`), ours exact (the same
 * policy without `lease`), the reference script (http-app.ts' minimal guard: one EVALSHA of the reference
 * script per decision, the cheapest correct way, see reference-script.ts) and rate-limiter-flexible's
 * guard. Per variant and round,
 * rotated: a warm-up, a saturated phase (LEASES.connections per process, closed loop) for decisions/s and
 * the Redis figures, then a phase at a fixed rate (LEASES.rate over all processes: the same load for
 * every variant) for the latency and the Redis figures at that load.
 *
 * Redis calls per decision: EVALSHA + EVAL calls (INFO commandstats) over the phase, divided by the
 * decisions (answers). Redis µs per decision: those calls' µs (commandstats; a script's time includes
 * the commands it calls), and INFO cpu (main thread user + sys) less Redis' idle rate measured for
 * 0.4 s before the phase. App CPU: /proc of the app processes. Nothing is asserted: the targets are
 * judged and reported.
 */

/** The variants: the routes of leases-app.ts. */
export const LEASES_VARIANTS = ['none', 'leased', 'exact', 'reference', 'rlf'] as const;
export type LeasesVariant = (typeof LEASES_VARIANTS)[number];

/** The figures of one phase of one variant. */
export interface LeasesPhase {
  seconds: number;
  decisions: number;
  decisionsPerSecond: number;
  non2xx: number;
  errors: number;
  p50Ms: number;
  p99Ms: number;
  scriptCalls: number;
  scriptCallsPerDecision: number;
  /** µs of the script commands (commandstats) per call. */
  scriptUsecPerCall: number;
  /** µs of the script commands (commandstats) per decision. */
  redisCommandUsPerDecision: number;
  /** INFO cpu (main thread) less the idle rate, per decision. */
  redisCpuUsPerDecision: number;
  /** Redis main-thread CPU seconds per second of the phase (cores). */
  redisBusy: number;
  appCpuUsPerDecision: number;
  /** The app processes' CPU seconds per second (cores, all processes together). */
  appBusy: number;
  /** This process (autocannon) CPU seconds per second. */
  loadBusy: number;
}

export interface LeasesRun {
  round: number;
  variant: LeasesVariant;
  saturated: LeasesPhase;
  fixed: LeasesPhase;
  /** The keys under the step's prefix right after this variant's phases (the run's prefix left out). */
  keys: string[];
  /** p99 minus no limiter's p99 in the same round (ms). */
  p99AddedMs: { saturated: number; fixed: number };
}

export interface LeasesSummary {
  decisionsPerSecond: Spread;
  ratioToNone: Spread;
  scriptCallsPerDecision: Spread;
  scriptUsecPerCall: Spread;
  redisCommandUsPerDecision: Spread;
  redisCpuUsPerDecision: Spread;
  redisBusy: Spread;
  appCpuUsPerDecision: Spread;
  appBusy: Spread;
  loadBusy: Spread;
  p99SaturatedMs: Spread;
  fixed: {
    decisionsPerSecond: Spread;
    scriptCallsPerDecision: Spread;
    redisCommandUsPerDecision: Spread;
    redisCpuUsPerDecision: Spread;
    p50Ms: Spread;
    p99Ms: Spread;
    p99AddedMs: Spread;
  };
}

export interface LeasesTarget {
  name: string;
  goal: string;
  figure: Spread;
  unit: string;
  verdict: Verdict;
  detail: string;
}

export interface LeasesResult {
  settings: typeof LEASES;
  method: string;
  runs: LeasesRun[];
  summary: Partial<Record<LeasesVariant, LeasesSummary>>;
  targets: LeasesTarget[];
}

/** The targets of issue 35, item 3. */
const GOALS = { callsPerDecision: 0.05, cpuShareOfExact: 1 / 20, p99AddedMs: 0.1 };

const perVariantSeconds = () => LEASES.warmupSeconds + LEASES.seconds + LEASES.rateWarmupSeconds + LEASES.rateSeconds + 1.2;

export const leasesPlannedSeconds = () => 10 + LEASES.rounds * LEASES_VARIANTS.length * perVariantSeconds();

interface Apps {
  urls: string[];
  pids: (number | undefined)[];
  stop(): Promise<void>;
}

/** Starts one leases-app.js process on a free port; resolves with its URL once it listens. */
async function startApp(prefix: string) {
  const child = track(spawn(process.execPath, [join(HERE, 'leases-app.js'), prefix], { stdio: ['ignore', 'pipe', 'inherit'] }));
  const lines = createInterface({ input: child.stdout! });
  const port = await new Promise<number>((done, fail) => {
    const timer = setTimeout(() => fail(new Error('leases app did not start within 60 s')), 60_000);
    child.once('exit', (code) => fail(new Error(`leases app exited with ${code} before listening`)));
    lines.once('line', (line) => {
      clearTimeout(timer);
      done((JSON.parse(line) as { port: number }).port);
    });
  });
  return { child, url: `http://127.0.0.1:${port}` };
}

/** Redis' main-thread CPU rate (s/s) while the bench sends nothing but INFO. */
async function idleRate(redis: Redis): Promise<number> {
  const c0 = await redisCpuSeconds(redis);
  const t0 = performance.now();
  await sleep(400);
  return ((await redisCpuSeconds(redis)) - c0) / ((performance.now() - t0) / 1000);
}

interface Answers {
  ok: number;
  non2xx: number;
  errors: number;
  p50Ms: number;
  p99Ms: number;
}

function answersOf(ok: number, non2xx: number, errors: number, latencies: ArrayLike<number>): Answers {
  return { ok, non2xx, errors, p50Ms: quantile(latencies, 0.5), p99Ms: quantile(latencies, 0.99) };
}

/** Saturation: one autocannon per app process, all at once, LEASES.connections each, for `seconds`. */
async function saturate(urls: string[], path: LeasesVariant, seconds: number): Promise<Answers> {
  const latencies: number[] = [];
  const results = await Promise.all(
    urls.map((url) => {
      const instance = autocannon({ url: `${url}/${path}`, connections: LEASES.connections, duration: seconds });
      instance.on('response', (_client, _status, _bytes, responseTime) => latencies.push(responseTime));
      return instance;
    }),
  );
  const sum = (f: (r: (typeof results)[number]) => number) => results.reduce((n, r) => n + f(r), 0);
  return answersOf(
    sum((r) => r['2xx']),
    sum((r) => r.non2xx),
    sum((r) => r.errors + r.timeouts),
    latencies,
  );
}

/**
 * A paced open loop: `rate` requests per second over all app processes (round robin), each sent when
 * it is due (checked every ms), over keep-alive connections; a request's latency counts from when it
 * was due, so a late send or a wait for a free connection is in it. (autocannon's overallRate sends
 * each second's requests at the start of the second, a burst, not a steady load.)
 */
async function paced(urls: string[], path: LeasesVariant, seconds: number, rate: number): Promise<Answers> {
  const agents = urls.map(() => new Agent({ keepAlive: true, maxSockets: LEASES.connections }));
  const latencies: number[] = [];
  let ok = 0;
  let non2xx = 0;
  let errors = 0;
  let sent = 0;
  let pending = 0;
  const t0 = performance.now();
  const total = Math.round(rate * seconds);
  await new Promise<void>((done) => {
    const finish = () => {
      if (sent === total && pending === 0) done();
    };
    const send = (due: number) => {
      const i = sent++ % urls.length;
      pending++;
      const settle = () => {
        pending--;
        finish();
      };
      const request = httpGet(`${urls[i]}/${path}`, { agent: agents[i] }, (response) => {
        response.resume();
        response.on('end', () => {
          latencies.push(performance.now() - due);
          if (response.statusCode === 200) ok++;
          else non2xx++;
          settle();
        });
      });
      request.on('error', () => {
        errors++;
        settle();
      });
    };
    const timer = setInterval(() => {
      const now = performance.now();
      const due = Math.min(total, Math.floor(((now - t0) / 1000) * rate));
      while (sent < due) send(t0 + (sent * 1000) / rate);
      if (sent === total) {
        clearInterval(timer);
        finish();
      }
    }, 1);
  });
  for (const agent of agents) agent.destroy();
  return answersOf(ok, non2xx, errors, latencies);
}

/**
 * One measured phase, straight after its warm-up: `idle` is Redis' idle CPU rate, measured before the
 * warm-up (a pause between warm-up and phase would let a leased key go cold: after 200 ms without
 * demand, a bucket is decided exactly until it is hot again).
 */
async function phase(redis: Redis, apps: Apps, path: LeasesVariant, seconds: number, rate: number, idle: number): Promise<LeasesPhase> {
  const app0 = apps.pids.map(processCpuSeconds);
  const load0 = process.cpuUsage();
  const cpu0 = await redisCpuSeconds(redis);
  const stats0 = await commandStats(redis);
  const t0 = performance.now();
  const answers = rate > 0 ? await paced(apps.urls, path, seconds, rate) : await saturate(apps.urls, path, seconds);
  const wall = (performance.now() - t0) / 1000;
  const stats1 = await commandStats(redis);
  const cpu = (await redisCpuSeconds(redis)) - cpu0;
  const load = process.cpuUsage(load0);
  const app = apps.pids.map(processCpuSeconds).reduce((sum, c, i) => sum + c - app0[i], 0);
  const script = scriptCost(stats0, stats1);
  const decisions = answers.ok + answers.non2xx;
  const per = (x: number) => x / Math.max(1, decisions);
  return {
    seconds: round(wall, 3),
    decisions,
    decisionsPerSecond: round(decisions / wall, 0),
    non2xx: answers.non2xx,
    errors: answers.errors,
    p50Ms: round(answers.p50Ms, 3),
    p99Ms: round(answers.p99Ms, 3),
    scriptCalls: script.calls,
    scriptCallsPerDecision: round(per(script.calls), 5),
    scriptUsecPerCall: round(script.usec / Math.max(1, script.calls), 2),
    redisCommandUsPerDecision: round(per(script.usec), 3),
    redisCpuUsPerDecision: round(per(Math.max(0, cpu - idle * wall) * 1e6), 3),
    redisBusy: round(cpu / wall, 3),
    appCpuUsPerDecision: round(per(app * 1e6), 1),
    appBusy: round(app / wall, 3),
    loadBusy: round((load.user + load.system) / 1e6 / wall, 3),
  };
}

async function startApps(prefix: string): Promise<Apps> {
  const started = await Promise.all(Array.from({ length: LEASES.processes }, () => startApp(prefix)));
  // One request per route and process: every route answers, and every limiter is connected to Redis.
  for (const app of started) {
    for (const path of LEASES_VARIANTS) {
      const answer = await fetch(`${app.url}/${path}`);
      if (answer.status !== 200) throw new Error(`leases: GET /${path} answered ${answer.status}`);
    }
  }
  return {
    urls: started.map((a) => a.url),
    pids: started.map((a) => a.child.pid),
    stop: async () => void (await Promise.all(started.map((a) => stopChild(a.child)))),
  };
}

export async function leasesStep(redis: Redis, runPrefix: string): Promise<LeasesResult> {
  const t0 = Date.now();
  const prefix = `${runPrefix}leases:`;
  let apps: Apps | undefined;
  try {
    apps = await startApps(prefix);
    progress('leases', `started ${LEASES.processes} app processes`, Date.now() - t0, 10);

    const runs: LeasesRun[] = [];
    const total = LEASES.rounds * LEASES_VARIANTS.length;
    for (let r = 0; r < LEASES.rounds; r++) {
      const inRound: LeasesRun[] = [];
      for (const variant of rotate(LEASES_VARIANTS, r)) {
        const t = Date.now();
        const idle = await idleRate(redis);
        await saturate(apps.urls, variant, LEASES.warmupSeconds);
        const saturated = await phase(redis, apps, variant, LEASES.seconds, 0, idle);
        if (LEASES.rateWarmupSeconds > 0) await paced(apps.urls, variant, LEASES.rateWarmupSeconds, LEASES.rate);
        const fixed = await phase(redis, apps, variant, LEASES.rateSeconds, LEASES.rate, idle);
        const keys = (await scanKeys(redis, `${prefix}*`)).map((key) => key.slice(runPrefix.length)).sort();
        const run: LeasesRun = { round: r + 1, variant, saturated, fixed, keys, p99AddedMs: { saturated: NaN, fixed: NaN } };
        inRound.push(run);
        runs.push(run);
        progress(
          `leases ${runs.length}/${total}`,
          `round ${r + 1} ${variant}: saturated ${fmt(saturated.decisionsPerSecond)} decisions/s, ` +
            `${saturated.scriptCallsPerDecision.toFixed(4)} Redis calls and ${saturated.redisCommandUsPerDecision.toFixed(2)} µs ` +
            `(INFO cpu ${saturated.redisCpuUsPerDecision.toFixed(2)} µs) per decision, Redis ${saturated.redisBusy} cores, apps ${saturated.appBusy}, ` +
            `p99 ${saturated.p99Ms.toFixed(2)} ms; at ${fmt(LEASES.rate)}/s: ${fmt(fixed.decisionsPerSecond)} decisions/s, ` +
            `${fixed.scriptCallsPerDecision.toFixed(4)} calls, ${fixed.redisCommandUsPerDecision.toFixed(2)} µs per decision, ` +
            `p50 ${fixed.p50Ms.toFixed(3)} ms, p99 ${fixed.p99Ms.toFixed(3)} ms` +
            `${saturated.non2xx + fixed.non2xx ? `, ${saturated.non2xx + fixed.non2xx} non-2xx` : ''}` +
            `${saturated.errors + fixed.errors ? `, ${saturated.errors + fixed.errors} errors` : ''}`,
          Date.now() - t,
          perVariantSeconds(),
        );
      }
      const none = inRound.find((run) => run.variant === 'none');
      for (const run of inRound) {
        run.p99AddedMs = {
          saturated: round(run.saturated.p99Ms - (none?.saturated.p99Ms ?? NaN), 3),
          fixed: round(run.fixed.p99Ms - (none?.fixed.p99Ms ?? NaN), 3),
        };
      }
    }

    return { settings: { ...LEASES }, method: method(), runs, summary: summarize(runs), targets: judgeTargets(runs) };
  } finally {
    await apps?.stop();
  }
}

function method(): string {
  const { processes, connections, warmupSeconds, seconds, rate, rateWarmupSeconds, rateSeconds, rounds } = LEASES;
  return (
    `One hot key per variant: ${processes} app processes (bench/leases-app.ts, Nest 12 + Express, one route per variant), every request ` +
    `from 127.0.0.1, so every process decides the same bucket of a route (ours, the minimal guard and rate-limiter-flexible's guard key by IP). ` +
    `The bucket allows everything (capacity ${LIMITS.allowed.capacity.toExponential()}, refill ${LIMITS.allowed.refillPerSecond.toExponential()}/s; ` +
    `rate-limiter-flexible ${LIMITS.allowed.limit.toExponential()} per ${LIMITS.allowed.windowMs / 1000} s): the figures are the cost of deciding. ` +
    `One autocannon per app process in the bench process, all at once. Per variant and round (${rounds} round(s), variants rotated): ` +
    `${warmupSeconds} s warm-up, ${seconds} s saturated (${connections} connections per process, closed loop), then ${rateWarmupSeconds} s and ` +
    `${rateSeconds} s at ${rate} requests/s over all processes (the same load for every variant: a paced open loop from the bench process, round robin over the processes, a request's latency counted from when it was due). ` +
    `Decisions: answers. Redis calls per decision: EVALSHA + EVAL calls (INFO commandstats) over the phase / decisions. Redis µs per decision: ` +
    `the script commands' µs (commandstats; a script's time includes the commands it calls), and INFO cpu (main thread user + sys) less ` +
    `Redis' idle rate measured for 0.4 s before the phase. App CPU: utime + stime of the app processes (/proc). p50 / p99: every answer's ` +
    `response time (saturated: autocannon's, sub-ms; paced: from when the request was due); p99 added: minus no limiter's p99 in the same round and phase.`
  );
}

function summarize(runs: readonly LeasesRun[]): Partial<Record<LeasesVariant, LeasesSummary>> {
  const summary: Partial<Record<LeasesVariant, LeasesSummary>> = {};
  for (const variant of LEASES_VARIANTS) {
    const mine = runs.filter((run) => run.variant === variant);
    if (mine.length === 0) continue;
    const of = (pick: (run: LeasesRun) => number, digits: number) => spreadOf(mine.map(pick), digits);
    const ratio = (run: LeasesRun) => {
      const none = runs.find((n) => n.variant === 'none' && n.round === run.round);
      return run.saturated.decisionsPerSecond / (none?.saturated.decisionsPerSecond ?? NaN);
    };
    summary[variant] = {
      decisionsPerSecond: of((run) => run.saturated.decisionsPerSecond, 0),
      ratioToNone: of(ratio, 3),
      scriptCallsPerDecision: of((run) => run.saturated.scriptCallsPerDecision, 4),
      scriptUsecPerCall: of((run) => run.saturated.scriptUsecPerCall, 1),
      redisCommandUsPerDecision: of((run) => run.saturated.redisCommandUsPerDecision, 3),
      redisCpuUsPerDecision: of((run) => run.saturated.redisCpuUsPerDecision, 3),
      redisBusy: of((run) => run.saturated.redisBusy, 3),
      appCpuUsPerDecision: of((run) => run.saturated.appCpuUsPerDecision, 1),
      appBusy: of((run) => run.saturated.appBusy, 3),
      loadBusy: of((run) => run.saturated.loadBusy, 3),
      p99SaturatedMs: of((run) => run.saturated.p99Ms, 2),
      fixed: {
        decisionsPerSecond: of((run) => run.fixed.decisionsPerSecond, 0),
        scriptCallsPerDecision: of((run) => run.fixed.scriptCallsPerDecision, 4),
        redisCommandUsPerDecision: of((run) => run.fixed.redisCommandUsPerDecision, 3),
        redisCpuUsPerDecision: of((run) => run.fixed.redisCpuUsPerDecision, 3),
        p50Ms: of((run) => run.fixed.p50Ms, 3),
        p99Ms: of((run) => run.fixed.p99Ms, 3),
        p99AddedMs: of((run) => run.p99AddedMs.fixed, 3),
      },
    };
  }
  return summary;
}

/** The targets of issue 35 item 3, judged per round (met: every round; missed: none; else within noise). */
function judgeTargets(runs: readonly LeasesRun[]): LeasesTarget[] {
  const rounds = [...new Set(runs.map((run) => run.round))];
  const find = (variant: LeasesVariant, r: number) => runs.find((run) => run.variant === variant && run.round === r);
  const perRound = (f: (leased: LeasesRun, r: number) => number, digits: number) =>
    spreadOf(
      rounds.map((r) => {
        const leased = find('leased', r);
        return leased ? f(leased, r) : NaN;
      }),
      digits,
    );
  const targets: LeasesTarget[] = [];
  const add = (name: string, goal: string, figure: Spread, unit: string, direction: 'atLeast' | 'atMost', at: number, detail: string) =>
    targets.push({ name, goal, figure, unit, verdict: judge(figure, direction, at), detail });
  add(
    'Redis calls per leased decision, saturated',
    `≤ ${GOALS.callsPerDecision}`,
    perRound((l) => l.saturated.scriptCallsPerDecision, 4),
    'calls',
    'atMost',
    GOALS.callsPerDecision,
    'EVALSHA + EVAL calls / decisions',
  );
  add(
    `Redis calls per leased decision at ${LEASES.rate}/s`,
    `≤ ${GOALS.callsPerDecision}`,
    perRound((l) => l.fixed.scriptCallsPerDecision, 4),
    'calls',
    'atMost',
    GOALS.callsPerDecision,
    'the same load for every variant',
  );
  const share = (pick: (p: LeasesPhase) => number, phaseOf: (run: LeasesRun) => LeasesPhase) => (l: LeasesRun, r: number) =>
    pick(phaseOf(l)) / pick(phaseOf(find('exact', r)!));
  add(
    'Redis command time per decision, leased / exact, saturated',
    `≤ 1/20 (${GOALS.cpuShareOfExact})`,
    perRound(
      share(
        (p) => p.redisCommandUsPerDecision,
        (run) => run.saturated,
      ),
      4,
    ),
    '× exact',
    'atMost',
    GOALS.cpuShareOfExact,
    'commandstats µs of EVALSHA/EVAL',
  );
  add(
    'Redis CPU (INFO cpu) per decision, leased / exact, saturated',
    `≤ 1/20 (${GOALS.cpuShareOfExact})`,
    perRound(
      share(
        (p) => p.redisCpuUsPerDecision,
        (run) => run.saturated,
      ),
      4,
    ),
    '× exact',
    'atMost',
    GOALS.cpuShareOfExact,
    "main thread user + sys, less the idle rate: includes the event loop's and the network's share",
  );
  add(
    `Redis command time per decision, leased / exact, at ${LEASES.rate}/s`,
    `≤ 1/20 (${GOALS.cpuShareOfExact})`,
    perRound(
      share(
        (p) => p.redisCommandUsPerDecision,
        (run) => run.fixed,
      ),
      4,
    ),
    '× exact',
    'atMost',
    GOALS.cpuShareOfExact,
    'commandstats µs of EVALSHA/EVAL',
  );
  add(
    `p99 added by a leased decision over no limiter, at ${LEASES.rate}/s`,
    `≤ ${GOALS.p99AddedMs} ms`,
    perRound((l) => l.p99AddedMs.fixed, 3),
    'ms',
    'atMost',
    GOALS.p99AddedMs,
    'p99 of leased minus p99 of no limiter, same round',
  );
  add(
    `p99 of a leased decision minus exact's, at ${LEASES.rate}/s`,
    `≤ ${GOALS.p99AddedMs} ms`,
    perRound((l, r) => l.fixed.p99Ms - find('exact', r)!.fixed.p99Ms, 3),
    'ms',
    'atMost',
    GOALS.p99AddedMs,
    'negative: leased is faster at the tail',
  );
  add(
    'decisions/s leased / no limiter, saturated',
    'bounded by the app, not Redis (≈ 1 × no limiter)',
    perRound((l, r) => l.saturated.decisionsPerSecond / find('none', r)!.saturated.decisionsPerSecond, 3),
    '× no limiter',
    'atLeast',
    0.95,
    'judged against 0.95 × no limiter; Redis main-thread cores while saturated in the table',
  );
  return targets;
}

const LABEL: Record<LeasesVariant, string> = {
  none: 'no limiter',
  leased: '**ours leased** (`lease: true`)',
  exact: 'ours exact',
  reference: 'reference script (minimal guard)',
  rlf: 'rate-limiter-flexible',
};

const SHORT: Record<LeasesVariant, string> = {
  none: 'no limiter',
  leased: 'ours leased',
  exact: 'ours exact',
  reference: 'floor: reference script',
  rlf: 'rate-limiter-flexible',
};

export function renderLeases(result: LeasesResult, heading: string, chart?: string): string {
  const variants = LEASES_VARIANTS.filter((v) => result.summary[v]);
  const s = (v: LeasesVariant) => result.summary[v]!;
  const cell = (x: Spread, digits: number) => spreadText(x, digits);
  const row = (label: string, f: (v: LeasesVariant) => string) => `| ${label} | ${variants.map(f).join(' | ')} |`;
  const dash = (v: LeasesVariant, text: string) => (v === 'none' ? '–' : text);
  const { processes, connections, rate, rounds } = result.settings;
  const lines = [
    `${heading} Leases (issue 35): one hot key, ${processes} app processes`,
    '',
    ...(chart ? [`![leases chart](${chart})`, ''] : []),
    `One route per variant, every request from 127.0.0.1: one bucket per route for the ${processes} processes, capacity and refill 1e9 ` +
      `(every decision allowed: the cost of deciding). Median (min–max) of ${rounds} round(s).`,
    '',
    `| | ${variants.map((v) => LABEL[v]).join(' | ')} |`,
    `|---|${variants.map(() => '---:').join('|')}|`,
    row(`decisions/s, saturated (${processes} × ${connections} connections)`, (v) => cell(s(v).decisionsPerSecond, 0)),
    row('… × no limiter', (v) => cell(s(v).ratioToNone, 3)),
    row('Redis calls per decision (EVALSHA + EVAL)', (v) => dash(v, cell(s(v).scriptCallsPerDecision, 4))),
    row('Redis command µs per call (commandstats)', (v) => dash(v, cell(s(v).scriptUsecPerCall, 1))),
    row('Redis command µs per decision (commandstats)', (v) => dash(v, cell(s(v).redisCommandUsPerDecision, 3))),
    row('Redis CPU µs per decision (INFO cpu less idle)', (v) => dash(v, cell(s(v).redisCpuUsPerDecision, 3))),
    row('Redis main thread, cores busy', (v) => cell(s(v).redisBusy, 3)),
    row('app CPU µs per decision (all processes)', (v) => cell(s(v).appCpuUsPerDecision, 1)),
    row('app processes, cores busy / load generator', (v) => `${cell(s(v).appBusy, 2)} / ${cell(s(v).loadBusy, 2)}`),
    row('p99 ms, saturated', (v) => cell(s(v).p99SaturatedMs, 2)),
    row(`**at ${fmt(rate)}/s** (the same load): decisions/s`, (v) => cell(s(v).fixed.decisionsPerSecond, 0)),
    row('… Redis calls per decision', (v) => dash(v, cell(s(v).fixed.scriptCallsPerDecision, 4))),
    row('… Redis command µs per decision', (v) => dash(v, cell(s(v).fixed.redisCommandUsPerDecision, 3))),
    row('… Redis CPU µs per decision (INFO cpu less idle)', (v) => dash(v, cell(s(v).fixed.redisCpuUsPerDecision, 3))),
    row('… p50 / p99 ms', (v) => `${cell(s(v).fixed.p50Ms, 3)} / ${cell(s(v).fixed.p99Ms, 3)}`),
    row('… p99 added over no limiter, ms', (v) => dash(v, cell(s(v).fixed.p99AddedMs, 3))),
    '',
    `${heading}# Targets of issue 35, item 3 (reported, not asserted)`,
    '',
    '| goal | measured, median (min–max) | verdict |',
    '|---|---|---|',
    ...result.targets.map(
      (t) =>
        `| ${t.name} ${t.goal} | ${cell(t.figure, t.unit === 'ms' ? 2 : t.unit === '× no limiter' ? 2 : 4)} ${t.unit} (${t.detail}) | ${t.verdict} |`,
    ),
    '',
    result.method,
    '',
    `Keys in Redis right after each variant (the run's prefix left out; a key lives 2 s after its last write): ${variants
      .map(
        (v) =>
          `${SHORT[v]}: ${[...new Set(result.runs.filter((run) => run.variant === v).flatMap((run) => run.keys))].map((k) => `\`${k}\``).join(', ') || 'none'}`,
      )
      .join('; ')}.`,
    '',
  ];
  return lines.join('\n');
}

/** The step's chart: decisions/s, Redis calls per decision, Redis µs per decision, p99 (bars: medians, whiskers: rounds). */
export function renderLeasesChart(result: LeasesResult, footer: string): string {
  const variants = LEASES_VARIANTS.filter((v) => result.summary[v]);
  const s = (v: LeasesVariant) => result.summary[v]!;
  const label = (v: LeasesVariant) => SHORT[v];
  const names: Record<LeasesVariant, string> = { none: 'none', leased: 'ours', exact: 'ours-exact', reference: 'reference', rlf: 'other' };
  const color = (v: LeasesVariant) => colorOf(names[v]);
  const blocks: string[] = [];
  let y = 10;
  const add = (title: string, subtitle: string, rows: Row[], lines: Line[] = [], lo = 0) => {
    const block = panel(y, title, subtitle, rows, lo, upper(rows, lines), lines);
    blocks.push(block.svg);
    y += block.height + 16;
  };
  const { processes, connections, rate, rounds } = result.settings;
  const limited = variants.filter((v) => v !== 'none');
  add(
    `Decisions per second on one hot key, ${processes} app processes (median, whisker = min–max of ${rounds} round(s); higher is better)`,
    `HTTP GET, ${processes} × ${connections} connections, closed loop; every decision allowed (capacity and refill 1e9)`,
    variants.map((v) => ({
      label: label(v),
      value: s(v).decisionsPerSecond.median,
      spread: s(v).decisionsPerSecond,
      text: `${spreadText(s(v).decisionsPerSecond)} /s · Redis ${num(s(v).redisBusy.median, 2)} cores · apps ${num(s(v).appBusy.median, 2)} cores`,
      color: color(v),
    })),
  );
  const calls = limited.map((v) => ({
    label: label(v),
    value: s(v).scriptCallsPerDecision.median,
    spread: s(v).scriptCallsPerDecision,
    text: `${spreadText(s(v).scriptCallsPerDecision, 4)} saturated · ${num(s(v).fixed.scriptCallsPerDecision.median, 4)} at ${fmt(rate)}/s`,
    color: color(v),
  }));
  add(
    'Redis calls per decision, saturated (EVALSHA + EVAL, INFO commandstats; lower is better)',
    'ours exact coalesces the decisions of one event-loop turn into one call; each decision still runs in the script',
    calls,
    [{ at: GOALS.callsPerDecision, label: `target for leased: ≤ ${GOALS.callsPerDecision}` }],
  );
  const exact = s('exact')?.redisCommandUsPerDecision.median ?? NaN;
  add(
    'Redis command time per decision, saturated (µs, INFO commandstats of the scripts; lower is better)',
    'INFO cpu (main thread, less the idle rate) beside it',
    limited.map((v) => ({
      label: label(v),
      value: s(v).redisCommandUsPerDecision.median,
      spread: s(v).redisCommandUsPerDecision,
      text: `${spreadText(s(v).redisCommandUsPerDecision, 3)} µs · INFO cpu ${num(s(v).redisCpuUsPerDecision.median, 2)} µs`,
      color: color(v),
    })),
    [{ at: exact * GOALS.cpuShareOfExact, label: 'target for leased: ≤ 1/20 of ours exact' }],
  );
  const p99Rows = variants.map((v) => ({
    label: label(v),
    value: s(v).fixed.p99Ms.median,
    spread: s(v).fixed.p99Ms,
    text: `p99 ${spreadText(s(v).fixed.p99Ms, 3)} ms · p50 ${num(s(v).fixed.p50Ms.median, 3)} ms`,
    color: color(v),
  }));
  const none = s('none')?.fixed.p99Ms.median ?? NaN;
  add(
    `p99 latency at ${fmt(rate)} requests/s over the ${processes} processes (ms; the same load for each; lower is better)`,
    'paced open loop, latency from when each request was due; the line: no limiter + 0.1 ms',
    p99Rows,
    [{ at: none + GOALS.p99AddedMs, label: `target for leased: ≤ no limiter + ${GOALS.p99AddedMs} ms` }],
  );
  blocks.push(`<text x="20" y="${y + 4}" class="note">${escape(footer)}</text>`);
  const height = y + 16;
  return svgDocument(blocks, height);
}

/** The labels the results carry for each variant. */
export const LEASES_ALGORITHMS: Record<LeasesVariant, string> = {
  none: `${LABELS.none} (GET /none; the module's global guard and interceptor run and find no policy)`,
  leased:
    'ours (nest-redis-rate-limit) with lease: true: per process a batch of tokens taken by lease.lua and spent without a call, ' +
    'renewed at half a batch (batch = min(demand × lifeMs / 2, capacity / 20, tokens / 4))',
  exact: `${LABELS.ours}, the same policy without lease: decide.lua per decision (decisions of one event-loop turn coalesced into one call)`,
  reference: `${LABELS['minimal-guard']}, on its route only`,
  rlf: `${LABELS['rate-limiter-flexible']} behind the short guard its users write (http-app.ts), on its route only`,
};

/** `node dist/bench/leases-step.js bench/results/<name>-leases.json` re-renders its .md and .svg (the machine line kept from the JSON). */
if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const input = process.argv[2];
  if (!input?.endsWith('-leases.json')) throw new Error('usage: node dist/bench/leases-step.js bench/results/<name>-leases.json');
  const saved = JSON.parse(readFileSync(input, 'utf8')) as LeasesResult & {
    machine: Record<string, unknown> & { loadAverageAtStart: number[]; loadAverageAtEnd: number[] };
  };
  const m = saved.machine;
  const base = input.slice(0, -'.json'.length);
  const date = basename(base).slice(0, 10);
  const footer = `${date} · ${String(m.cpu)}, ${String(m.cores)} cores · ${String(m.os)} · Node ${String(m.node)} · Redis ${String(m.redis)} (${String(m.redisServer)}) · apps, Redis and load generator on the same machine`;
  writeFileSync(`${base}.svg`, renderLeasesChart(saved, footer));
  const machineLine = `Machine: ${String(m.cpu)} × ${String(m.cores)}, ${String(m.os)}, Node ${String(m.node)}, Redis ${String(m.redis)} (${String(m.redisServer)}), load average ${m.loadAverageAtStart.join(' ')} at the start, ${m.loadAverageAtEnd.join(' ')} at the end. ${String(m.note ?? '')}`;
  writeFileSync(`${base}.md`, `${renderLeases(saved, '#', `${basename(base)}.svg`)}\n${machineLine}\n`);
  console.log(`wrote ${base}.{md,svg}`);
}
