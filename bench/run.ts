import { type ChildProcess, fork, spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { cpus, loadavg, release, totalmem, type } from 'node:os';
import { basename, dirname, join, relative, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import autocannon from 'autocannon';
import { Redis } from 'ioredis';
import { renderChart } from './chart.js';
import type { RunReply, WorkerMessage } from './decisions-worker.js';
import { limiterPrefix } from './limiters.js';
import type { PromiseReply } from './promise-worker.js';
import { renderReport } from './report.js';
import type { BenchResults, DecisionRun, HttpRun, HttpSummary, PromiseResult, Target } from './results.js';
import {
  HTTP_PATHS,
  HTTP_VARIANTS,
  type HttpPath,
  type HttpVariant,
  LIMITERS,
  LIMITS,
  type LimiterName,
  PROBE_LENGTH_MS,
  PROBE_OPEN_MS,
  REDIS_URL,
  SETTINGS,
} from './settings.js';
import { maxInWindow, median, round } from './stats.js';

/**
 * `npm run bench`: HTTP overhead, decisions per second and Redis cost, and the promise, for our
 * limiter and the alternatives, in one run. Writes bench/results/<date>.{json,svg,md}.
 * Keys live under a prefix of the run's own and are deleted at the end; nothing is flushed.
 * BENCH_ONLY=http,decisions,promise runs a subset, BENCH_VARIANTS=ours,... only some HTTP variants; such
 * runs write <date>-partial.* (BENCH_OUT=<name> names the files).
 * BENCH_PROFILE=<variant> starts that HTTP variant with --cpu-prof (profiles in .bench-tmp/profiles).
 */

const HERE = dirname(fileURLToPath(import.meta.url));
const ROOT = resolve(HERE, '../..');
const RESULTS_DIR = join(ROOT, 'bench', 'results');
const RUN_PREFIX = `rl-bench:${randomUUID().slice(0, 8)}:`;
const ONLY = new Set((process.env.BENCH_ONLY ?? 'http,decisions,promise').split(',').map((s) => s.trim()));
const PROFILE = process.env.BENCH_PROFILE;
const PROMISE_LIMITERS: LimiterName[] = ['ours', 'rate-limiter-flexible', 'nestjs-throttler'];

const children = new Set<ChildProcess>();
/** USER_HZ: the unit of utime and stime in /proc/<pid>/stat (100 on every common Linux). */
const CLOCK_TICKS = 100;
const started = Date.now();
let plannedSeconds = 0;
let doneSeconds = 0;

function clock(ms: number): string {
  const s = Math.max(0, Math.round(ms / 1000));
  return `${Math.floor(s / 60)}:${String(s % 60).padStart(2, '0')}`;
}

/** One progress line: what finished, how long it took, and how long the run has left (estimated). */
function progress(step: string, message: string, tookMs: number, plannedForIt = 0): void {
  doneSeconds += plannedForIt;
  const left = Math.max(0, plannedSeconds - doneSeconds);
  console.log(
    `[${step}] ${message} (${(tookMs / 1000).toFixed(1)} s; ${clock(Date.now() - started)} elapsed, ~${clock(left * 1000)} left)`,
  );
}

const fmt = (n: number) => Math.round(n).toLocaleString('en-US');

function track(child: ChildProcess): ChildProcess {
  children.add(child);
  child.once('exit', () => children.delete(child));
  return child;
}

async function stopChild(child: ChildProcess, signal: NodeJS.Signals = 'SIGTERM'): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise<void>((done) => child.once('exit', () => done()));
  child.kill(signal);
  const timer = setTimeout(() => child.kill('SIGKILL'), 5_000);
  await exited;
  clearTimeout(timer);
}

/* ---------------------------------------------------------------- Redis */

async function redisCpuSeconds(redis: Redis): Promise<number> {
  const info = await redis.info('cpu');
  const field = (name: string) => Number(new RegExp(`^${name}:([\\d.]+)`, 'm').exec(info)?.[1] ?? NaN);
  const main = field('used_cpu_user_main_thread') + field('used_cpu_sys_main_thread');
  return Number.isFinite(main) ? main : field('used_cpu_user') + field('used_cpu_sys');
}

async function scanKeys(redis: Redis, pattern: string): Promise<string[]> {
  const found: string[] = [];
  let cursor = '0';
  do {
    const [next, keys] = await redis.scan(cursor, 'MATCH', pattern, 'COUNT', 1000);
    cursor = next;
    found.push(...keys);
  } while (cursor !== '0');
  return found;
}

async function deleteRunKeys(redis: Redis): Promise<number> {
  const keys = await scanKeys(redis, `${RUN_PREFIX}*`);
  for (let i = 0; i < keys.length; i += 500) await redis.del(...keys.slice(i, i + 500));
  return keys.length;
}

/* ---------------------------------------------------------------- HTTP */

interface App {
  variant: HttpVariant;
  child: ChildProcess;
  url: string;
}

async function startApp(variant: HttpVariant): Promise<App> {
  const args = [join(HERE, 'http-app.js'), variant, `${RUN_PREFIX}http:${variant}:`];
  if (PROFILE === variant) {
    const dir = join(ROOT, '.bench-tmp', 'profiles');
    mkdirSync(dir, { recursive: true });
    args.unshift('--cpu-prof', `--cpu-prof-dir=${dir}`);
  }
  const child = track(spawn(process.execPath, args, { stdio: ['ignore', 'pipe', 'inherit'] }));
  const lines = createInterface({ input: child.stdout! });
  const port = await new Promise<number>((done, fail) => {
    const timer = setTimeout(() => fail(new Error(`${variant} app did not start within 20 s`)), 20_000);
    child.once('exit', (code) => fail(new Error(`${variant} app exited with ${code} before listening`)));
    lines.once('line', (line) => {
      clearTimeout(timer);
      done((JSON.parse(line) as { port: number }).port);
    });
  });
  return { variant, child, url: `http://127.0.0.1:${port}` };
}

/** Checks that a variant limits at all (and that the overridden throttler storage works on Nest 12). */
async function checkApp(app: App, redis: Redis): Promise<string> {
  const first = await fetch(`${app.url}/allowed`);
  if (first.status !== 200) throw new Error(`${app.variant}: GET /allowed answered ${first.status}`);
  const statuses: number[] = [];
  for (let i = 0; i < LIMITS.denied.capacity + 5; i++) statuses.push((await fetch(`${app.url}/denied`)).status);
  const denied = statuses.filter((s) => s === 429).length;
  const keys = await scanKeys(redis, `${RUN_PREFIX}http:${app.variant}:*`);
  if (app.variant === 'none') {
    if (denied !== 0) throw new Error('none: /denied answered 429');
    return 'no limit, no keys';
  }
  if (denied === 0 || keys.length === 0) {
    throw new Error(`${app.variant}: /denied never answered 429 (statuses ${statuses.join(',')}; ${keys.length} keys in Redis)`);
  }
  return `${first.headers.get('x-ratelimit-limit') ?? '?'} limit header, ${denied}/${statuses.length} of a burst denied, ${keys.length} keys in Redis`;
}

/** CPU seconds (user + system) a process has used so far; NaN where /proc is not available. */
function processCpuSeconds(pid: number | undefined): number {
  try {
    const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
    return (Number(fields[11]) + Number(fields[12])) / CLOCK_TICKS;
  } catch {
    return Number.NaN;
  }
}

async function load(url: string, seconds: number) {
  return autocannon({ url, connections: SETTINGS.connections, duration: seconds });
}

function rotate<T>(items: readonly T[], by: number): T[] {
  const k = by % items.length;
  return [...items.slice(k), ...items.slice(0, k)];
}

async function httpStep(redis: Redis): Promise<{ runs: HttpRun[]; summary: BenchResults['http']['summary']; checks: Record<string, string> }> {
  const variants = HTTP_VARIANTS.filter((v) => Object.values(HTTP_PATHS).some((list) => (list as readonly string[]).includes(v)));
  const t0 = Date.now();
  const apps = new Map<HttpVariant, App>();
  for (const variant of variants) apps.set(variant, await startApp(variant));
  const checks: Record<string, string> = {};
  for (const app of apps.values()) checks[app.variant] = await checkApp(app, redis);
  progress('http', `started ${apps.size} apps; checks: ${Object.entries(checks).map(([v, c]) => `${v}: ${c}`).join('; ')}`, Date.now() - t0);

  const runs: HttpRun[] = [];
  const perRun = SETTINGS.httpWarmupSeconds + SETTINGS.httpSeconds + 0.3;
  const total = SETTINGS.httpRounds * Object.values(HTTP_PATHS).reduce((n, list) => n + list.length, 0);
  for (let r = 0; r < SETTINGS.httpRounds; r++) {
    for (const path of Object.keys(HTTP_PATHS) as HttpPath[]) {
      const inRound: HttpRun[] = [];
      for (const variant of rotate(HTTP_PATHS[path], r)) {
        const t = Date.now();
        const url = `${apps.get(variant)!.url}/${path}`;
        if (SETTINGS.httpWarmupSeconds > 0) await load(url, SETTINGS.httpWarmupSeconds);
        const app = apps.get(variant)!.child;
        const appCpu0 = processCpuSeconds(app.pid);
        const redisCpu0 = await redisCpuSeconds(redis);
        const result = await load(url, SETTINGS.httpSeconds);
        const appCpu = processCpuSeconds(app.pid) - appCpu0;
        const redisCpu = (await redisCpuSeconds(redis)) - redisCpu0;
        const answered = result['2xx'] + result.non2xx;
        const run: HttpRun = {
          round: r + 1,
          path,
          variant,
          requestsPerSecond: result.requests.average,
          p50Ms: result.latency.p50,
          p99Ms: result.latency.p99,
          status2xx: result['2xx'],
          statusNon2xx: result.non2xx,
          errors: result.errors + result.timeouts,
          appCpuUsPerRequest: round((appCpu * 1e6) / Math.max(1, answered), 1),
          redisCpuUsPerRequest: round((redisCpu * 1e6) / Math.max(1, answered), 1),
          ratio: Number.NaN,
        };
        inRound.push(run);
        runs.push(run);
        progress(
          `http ${runs.length}/${total}`,
          `round ${r + 1} ${path} ${variant}: ${fmt(run.requestsPerSecond)} req/s, p50 ${run.p50Ms} ms, p99 ${run.p99Ms} ms, ` +
            `${fmt(run.status2xx)} 2xx / ${fmt(run.statusNon2xx)} other${run.errors ? `, ${run.errors} errors` : ''}; ` +
            `CPU per request: app ${run.appCpuUsPerRequest} µs, Redis ${run.redisCpuUsPerRequest} µs`,
          Date.now() - t,
          perRun,
        );
      }
      const none = inRound.find((run) => run.variant === 'none')!.requestsPerSecond;
      for (const run of inRound) run.ratio = run.requestsPerSecond / none;
      console.log(
        `         round ${r + 1} ${path} ratios: ${inRound.map((run) => `${run.variant} ${run.ratio.toFixed(3)}`).join(', ')}`,
      );
    }
  }
  await Promise.all([...apps.values()].map((app) => stopChild(app.child)));

  const summary = {} as BenchResults['http']['summary'];
  for (const path of Object.keys(HTTP_PATHS) as HttpPath[]) {
    summary[path] = {};
    for (const variant of HTTP_PATHS[path]) {
      const mine = runs.filter((run) => run.path === path && run.variant === variant);
      if (mine.length === 0) continue;
      const answered = mine.reduce((n, run) => n + run.status2xx + run.statusNon2xx, 0);
      const s: HttpSummary = {
        requestsPerSecond: round(median(mine.map((run) => run.requestsPerSecond))),
        p50Ms: median(mine.map((run) => run.p50Ms)),
        p99Ms: median(mine.map((run) => run.p99Ms)),
        ratio: round(median(mine.map((run) => run.ratio)), 3),
        share2xx: round(mine.reduce((n, run) => n + run.status2xx, 0) / Math.max(1, answered), 4),
        appCpuUsPerRequest: round(median(mine.map((run) => run.appCpuUsPerRequest)), 1),
        redisCpuUsPerRequest: round(median(mine.map((run) => run.redisCpuUsPerRequest)), 1),
      };
      summary[path][variant] = s;
    }
  }
  return { runs, summary, checks };
}

/* ---------------------------------------------------------------- decisions */

interface Worker {
  name: LimiterName;
  child: ChildProcess;
}

function forkWorker(file: string, args: string[]): ChildProcess {
  return track(fork(join(HERE, file), args, { stdio: ['ignore', 'inherit', 'inherit', 'ipc'] }));
}

function nextMessage<T>(child: ChildProcess, what: string, timeoutMs = 60_000): Promise<T> {
  return new Promise<T>((done, fail) => {
    const timer = setTimeout(() => fail(new Error(`no ${what} within ${timeoutMs} ms`)), timeoutMs);
    const onExit = (code: number | null) => fail(new Error(`worker exited with ${code} while waiting for ${what}`));
    child.once('exit', onExit);
    child.once('message', (message: T) => {
      clearTimeout(timer);
      child.off('exit', onExit);
      done(message);
    });
  });
}

async function decisionsStep(redis: Redis): Promise<BenchResults['decisions']> {
  const t0 = Date.now();
  const workers: Worker[] = [];
  for (const name of LIMITERS) {
    const child = forkWorker('decisions-worker.js', [name, limiterPrefix(`${RUN_PREFIX}dec:`, name)]);
    workers.push({ name, child });
    await nextMessage(child, `${name} ready`);
  }
  progress('decisions', `started ${workers.length} worker processes`, Date.now() - t0);

  const runs: DecisionRun[] = [];
  const total = SETTINGS.decisionRounds * workers.length;
  const perRun = 1.5 + SETTINGS.decisionSeconds;
  for (let r = 0; r < SETTINGS.decisionRounds; r++) {
    const inRound: DecisionRun[] = [];
    for (const worker of rotate(workers, r)) {
      const t = Date.now();
      // Redis is shared: its CPU rate just before the run is subtracted as background.
      const idle0 = await redisCpuSeconds(redis);
      const idleT0 = performance.now();
      await sleep(400);
      const background = ((await redisCpuSeconds(redis)) - idle0) / ((performance.now() - idleT0) / 1000);
      const message: WorkerMessage = {
        cmd: 'run',
        inFlight: SETTINGS.inFlight,
        keys: SETTINGS.decisionKeys,
        warmupMs: 1_000,
        durationMs: SETTINGS.decisionSeconds * 1000,
      };
      worker.child.send(message);
      await nextMessage(worker.child, 'measuring');
      const cpu0 = await redisCpuSeconds(redis);
      const cpuT0 = performance.now();
      const reply = await nextMessage<RunReply>(worker.child, 'run result');
      const cpu1 = await redisCpuSeconds(redis);
      const cpuSeconds = cpu1 - cpu0 - background * ((performance.now() - cpuT0) / 1000);
      const run: DecisionRun = {
        round: r + 1,
        limiter: worker.name,
        decisionsPerSecond: reply.decisions / reply.seconds,
        errors: reply.errors,
        redisCpuUsPerDecision: Math.max(0, (cpuSeconds * 1e6) / Math.max(1, reply.decisions)),
        ratioToFloor: Number.NaN,
      };
      inRound.push(run);
      runs.push(run);
      progress(
        `decisions ${runs.length}/${total}`,
        `round ${r + 1} ${worker.name}: ${fmt(run.decisionsPerSecond)} decisions/s, Redis ${run.redisCpuUsPerDecision.toFixed(1)} µs CPU each` +
          `${run.errors ? `, ${run.errors} errors` : ''}`,
        Date.now() - t,
        perRun,
      );
    }
    const floor = inRound.find((run) => run.limiter === 'evalsha')!.decisionsPerSecond;
    for (const run of inRound) run.ratioToFloor = run.decisionsPerSecond / floor;
    console.log(`         round ${r + 1} ratios to EVALSHA: ${inRound.map((run) => `${run.limiter} ${run.ratioToFloor.toFixed(3)}`).join(', ')}`);
  }

  const t1 = Date.now();
  const memory: Partial<Record<LimiterName, { bytes: number; keys: number }>> = {};
  for (const worker of workers) {
    worker.child.send({ cmd: 'memory', count: SETTINGS.memoryBuckets } satisfies WorkerMessage);
    await nextMessage(worker.child, 'memory done');
    const keys = await scanKeys(redis, `${limiterPrefix(`${RUN_PREFIX}dec:`, worker.name)}idle:*`);
    const pipeline = redis.pipeline();
    for (const key of keys) pipeline.call('MEMORY', 'USAGE', key, 'SAMPLES', '0');
    const sizes = ((await pipeline.exec()) ?? []).map(([, size]) => Number(size) || 0);
    memory[worker.name] = { bytes: sizes.reduce((a, b) => a + b, 0), keys: keys.length };
  }
  progress(
    'memory',
    `idle buckets: ${Object.entries(memory).map(([n, m]) => `${n} ${fmt(m.bytes / SETTINGS.memoryBuckets)} B in ${(m.keys / SETTINGS.memoryBuckets).toFixed(1)} key(s)`).join(', ')}`,
    Date.now() - t1,
    2,
  );
  await Promise.all(workers.map(async (w) => {
    w.child.send({ cmd: 'exit' } satisfies WorkerMessage);
    await new Promise((done) => (w.child.exitCode !== null ? done(undefined) : w.child.once('exit', done)));
  }));

  const summary: BenchResults['decisions']['summary'] = {};
  for (const name of LIMITERS) {
    const mine = runs.filter((run) => run.limiter === name);
    summary[name] = {
      decisionsPerSecond: round(median(mine.map((run) => run.decisionsPerSecond))),
      ratioToFloor: round(median(mine.map((run) => run.ratioToFloor)), 3),
      redisCpuUsPerDecision: round(median(mine.map((run) => run.redisCpuUsPerDecision)), 2),
      bytesPerIdleBucket: round((memory[name]?.bytes ?? NaN) / SETTINGS.memoryBuckets, 1),
      keysPerIdleBucket: round((memory[name]?.keys ?? NaN) / SETTINGS.memoryBuckets, 2),
    };
  }
  return { runs, summary };
}

/* ---------------------------------------------------------------- promise */

async function promiseStep(): Promise<BenchResults['promise']> {
  const out: BenchResults['promise'] = {};
  const { capacity, refillPerSecond, limit, windowMs } = LIMITS.promise;
  for (const name of PROMISE_LIMITERS) {
    const t = Date.now();
    const prefix = limiterPrefix(`${RUN_PREFIX}promise:`, name);
    const workers = Array.from({ length: SETTINGS.promiseProcesses }, (_, i) =>
      forkWorker('promise-worker.js', [name, prefix, 'one-key', String(i), String(SETTINGS.promiseInFlight), String(SETTINGS.promiseSeconds)]),
    );
    await Promise.all(workers.map((w) => nextMessage(w, `${name} promise worker ready`)));
    const replies = workers.map((w) => nextMessage<PromiseReply>(w, `${name} promise result`, 60_000));
    const goAt = Date.now() + 300;
    const probeAt = goAt + SETTINGS.promiseSeconds * 1000 + 800;
    for (const w of workers) w.send({ goAt, probeAt });
    const results = await Promise.all(replies);

    const saturated = results.flatMap((r) => r.saturation.allowed);
    const firstSent = Math.min(...results.map((r) => r.saturation.firstSentAt));
    const lastReply = Math.max(...results.map((r) => r.saturation.lastReplyAt));
    const seconds = (lastReply - firstSent) / 1000;
    const boundary = results.flatMap((r) => r.boundary.allowed);
    const tokenBucket = name === 'ours';
    const result: PromiseResult = tokenBucket
      ? {
          promise: `token bucket: ${refillPerSecond}/s, burst ${capacity} (at most ${capacity} + ${refillPerSecond}·t in any t seconds)`,
          saturation: {
            seconds: round(seconds, 3),
            allowed: saturated.length,
            bound: Math.floor(capacity + refillPerSecond * seconds),
            maxIn1s: maxInWindow(saturated, 1000),
            boundIn1s: capacity + refillPerSecond,
            denied: results.reduce((n, r) => n + r.saturation.denied, 0),
            errors: results.reduce((n, r) => n + r.saturation.errors + r.boundary.errors, 0),
          },
          boundary: {
            allowed: boundary.length,
            maxIn1s: maxInWindow(boundary, 1000),
            maxIn200ms: maxInWindow(boundary, 200),
            boundIn1s: capacity + refillPerSecond,
            boundIn200ms: Math.floor(capacity + refillPerSecond * 0.2),
          },
          kept: false,
        }
      : {
          promise: `fixed window: ${limit} per ${windowMs / 1000} s window (read: ${limit}/s)`,
          saturation: {
            seconds: round(seconds, 3),
            allowed: saturated.length,
            bound: limit * (Math.floor((seconds * 1000) / windowMs) + 1),
            maxIn1s: maxInWindow(saturated, 1000),
            boundIn1s: limit,
            denied: results.reduce((n, r) => n + r.saturation.denied, 0),
            errors: results.reduce((n, r) => n + r.saturation.errors + r.boundary.errors, 0),
          },
          boundary: {
            allowed: boundary.length,
            maxIn1s: maxInWindow(boundary, 1000),
            maxIn200ms: maxInWindow(boundary, 200),
            boundIn1s: limit,
            boundIn200ms: limit,
          },
          kept: false,
        };
    result.kept =
      result.saturation.allowed <= result.saturation.bound &&
      result.saturation.maxIn1s <= result.saturation.boundIn1s &&
      result.boundary.maxIn1s <= result.boundary.boundIn1s;
    out[name] = result;
    progress(
      'promise',
      `${name}: ${result.saturation.allowed} allowed in ${seconds.toFixed(2)} s (bound ${result.saturation.bound}), ` +
        `most in 1 s ${result.saturation.maxIn1s} (bound ${result.saturation.boundIn1s}); at a window boundary ` +
        `${result.boundary.maxIn1s} in 1 s, ${result.boundary.maxIn200ms} in 200 ms → ${result.kept ? 'kept' : 'NOT kept'}`,
      Date.now() - t,
      SETTINGS.promiseSeconds + (PROBE_OPEN_MS + PROBE_LENGTH_MS) / 1000 + 2,
    );
  }
  return out;
}

/* ---------------------------------------------------------------- run */

function targets(results: BenchResults): Target[] {
  const list: Target[] = [];
  const allowed = results.http.summary.allowed ?? {};
  const denied = results.http.summary.denied ?? {};
  const f = (n: number | undefined) => (n === undefined ? 'n/a' : n.toFixed(3));
  if (allowed.ours) {
    const others = (['nestjs-throttler', 'rate-limiter-flexible'] as const).map((v) => allowed[v]?.ratio ?? 0);
    list.push({ name: 'HTTP allowed path', goal: '>= 0.90 of no limiter', measured: f(allowed.ours.ratio), met: allowed.ours.ratio >= 0.9 });
    list.push({
      name: 'HTTP allowed path',
      goal: 'above every alternative',
      measured: `${f(allowed.ours.ratio)} vs ${others.map(f).join(' / ')}`,
      met: others.every((o) => allowed.ours!.ratio > o),
    });
  }
  if (denied.ours) {
    list.push({ name: 'HTTP denied path', goal: '>= 0.95 of no limiter', measured: f(denied.ours.ratio), met: denied.ours.ratio >= 0.95 });
  }
  const d = results.decisions.summary;
  if (d.ours) {
    list.push({ name: 'decisions/s', goal: '>= 0.95 of bare EVALSHA', measured: f(d.ours.ratioToFloor), met: d.ours.ratioToFloor >= 0.95 });
    const alternatives = (['rate-limiter-flexible', 'nestjs-throttler'] as const).map((l) => d[l]?.decisionsPerSecond ?? 0);
    list.push({
      name: 'decisions/s',
      goal: '>= both alternatives',
      measured: `${fmt(d.ours.decisionsPerSecond)} vs ${alternatives.map(fmt).join(' / ')}`,
      met: alternatives.every((a) => d.ours!.decisionsPerSecond >= a),
    });
  }
  for (const [name, p] of Object.entries(results.promise)) {
    if (name === 'ours') list.push({ name: 'promise', goal: 'ours never over-admits', measured: `${p!.saturation.allowed} / ${p!.saturation.bound}`, met: p!.kept });
  }
  return list;
}

function plan(): number {
  let seconds = 5;
  if (ONLY.has('http')) {
    const measurements = Object.values(HTTP_PATHS).reduce((n, list) => n + list.length, 0) * SETTINGS.httpRounds;
    seconds += 8 + measurements * (SETTINGS.httpWarmupSeconds + SETTINGS.httpSeconds + 0.3);
  }
  if (ONLY.has('decisions')) seconds += 5 + SETTINGS.decisionRounds * LIMITERS.length * (1.5 + SETTINGS.decisionSeconds) + 2;
  if (ONLY.has('promise')) seconds += PROMISE_LIMITERS.length * (SETTINGS.promiseSeconds + (PROBE_OPEN_MS + PROBE_LENGTH_MS) / 1000 + 2);
  return seconds;
}

async function main(): Promise<void> {
  const redis = new Redis(REDIS_URL, { maxRetriesPerRequest: 1 });
  redis.on('error', () => undefined);
  const t = Date.now();
  try {
    await redis.ping();
  } catch (error) {
    throw new Error(`No Redis at ${REDIS_URL} (${(error as Error).message}): start one, or set BENCH_REDIS_URL`);
  }
  const redisVersion = /redis_version:(\S+)/.exec(await redis.info('server'))?.[1] ?? 'unknown';
  plannedSeconds = plan();
  console.log(
    `bench: Redis ${redisVersion} at ${REDIS_URL}, keys under ${RUN_PREFIX}; steps: ${[...ONLY].join(', ')}; ` +
      `estimated ${clock(plannedSeconds * 1000)} (set BENCH_ROUNDS, BENCH_SECONDS, ... to change; see bench/settings.ts)`,
  );
  const loadAverageAtStart = loadavg().map((n) => round(n, 2));
  const cpu = cpus();
  const results: BenchResults = {
    schema: 1,
    date: new Date().toISOString().slice(0, 10),
    startedAt: new Date(started).toISOString(),
    durationSeconds: 0,
    machine: {
      cpu: cpu[0]?.model.trim() ?? 'unknown',
      cores: cpu.length,
      memoryGb: round(totalmem() / 2 ** 30, 1),
      os: `${type()} ${release()}`,
      node: process.version,
      redis: redisVersion,
      loadAverageAtStart,
      loadAverageAtEnd: [],
      note: process.env.BENCH_NOTE ?? '',
    },
    settings: { ...SETTINGS },
    limits: Object.fromEntries(Object.entries(LIMITS).map(([k, v]) => [k, { ...v }])),
    algorithms: {
      ours:
        'token bucket, one Redis hash {tokens, ts} per bucket; one EVALSHA (HMGET, refill from Redis TIME, HSET, PEXPIRE 2B/R) per decision; ' +
        'after a denial the instance denies locally until the next token can exist (deny cache, on by default)',
      evalsha: 'the same script sent with client.evalsha() through a plain ioredis client, no library around it: the floor',
      'rate-limiter-flexible':
        'fixed window counter, one string key per key and window; one EVALSHA (SET NX EX, INCRBY, PTTL) per consume; default options (no in-memory block)',
      'nestjs-throttler':
        'fixed window counter plus a block key; ThrottlerGuard calls storage.increment(): one EVAL that sends the script body every call (INCR, PTTL, GET/SET block)',
    },
    method: {
      http:
        `Each variant is its own Nest 12 Express app process (logger errors only) with GET /allowed (a limit nobody reaches) and GET /denied ` +
        `(${LIMITS.denied.capacity} per second, exceeded by the load); autocannon runs in the bench process, ${SETTINGS.connections} connections, ` +
        `${SETTINGS.httpWarmupSeconds} s warm-up then ${SETTINGS.httpSeconds} s measured, variants interleaved (rotated order) over ${SETTINGS.httpRounds} rounds; ` +
        `req/s is autocannon's mean per second; each variant's ratio is taken to "no limiter" in the same round, and the table shows medians.`,
      decisions:
        `One process per limiter keeps ${SETTINGS.inFlight} calls in flight over ${SETTINGS.decisionKeys} keys (a limit nobody reaches) for 1 s warm-up and ` +
        `${SETTINGS.decisionSeconds} s measured, limiters interleaved over ${SETTINGS.decisionRounds} rounds, medians shown. Redis CPU per decision: ` +
        `INFO cpu (main thread user+sys) delta over the measured part, minus the background rate measured for 0.4 s just before.`,
      memory: `${SETTINGS.memoryBuckets} buckets created with one decision each; MEMORY USAGE (SAMPLES 0) of every key they left, summed, divided by the buckets.`,
      promise:
        `${SETTINGS.promiseProcesses} processes × ${SETTINGS.promiseInFlight} calls in flight on one key for ${SETTINGS.promiseSeconds} s, each limiter set to 100 per second ` +
        `in its own terms; allowed replies are time-stamped on arrival and the busiest 1 s (sliding) is counted. Then the boundary probe on a fresh key: ` +
        `one request opens a window, and all processes saturate from ${PROBE_OPEN_MS} ms to ${PROBE_OPEN_MS + PROBE_LENGTH_MS} ms after it. ` +
        `Ours runs through BucketService with default options (deny cache on).`,
      denyCache:
        'After Redis denies a bucket, the instance keeps {tokens Redis returned, when the request was sent}; until tokens + R·elapsed (+1 ms for TIME ' +
        'truncation) could cover a cost it denies that cost without a Redis call. At most 10,000 buckets per instance (oldest out), ' +
        'cleared by reset() on this instance; a reset() on another instance is not seen.',
    },
    http: { runs: [], summary: { allowed: {}, denied: {} } },
    decisions: { runs: [], summary: {} },
    promise: {},
    targets: [],
  };
  progress('setup', `Redis answers; machine ${results.machine.cpu} × ${results.machine.cores}`, Date.now() - t);

  try {
    if (ONLY.has('http')) {
      const http = await httpStep(redis);
      results.http = { runs: http.runs, summary: http.summary };
      results.method.http += ` Start-up checks: ${Object.entries(http.checks).map(([v, c]) => `${v}: ${c}`).join('; ')}.`;
    }
    if (ONLY.has('decisions')) results.decisions = await decisionsStep(redis);
    if (ONLY.has('promise')) results.promise = await promiseStep();
  } finally {
    await Promise.all([...children].map((child) => stopChild(child, 'SIGKILL')));
    const deleted = await deleteRunKeys(redis);
    console.log(`[cleanup] deleted ${deleted} keys under ${RUN_PREFIX}`);
    await redis.quit();
  }

  results.machine.loadAverageAtEnd = loadavg().map((n) => round(n, 2));
  results.durationSeconds = round((Date.now() - started) / 1000, 1);
  results.targets = targets(results);
  mkdirSync(RESULTS_DIR, { recursive: true });
  // A subset run must not overwrite the day's full results.
  const partial = ONLY.size < 3 || process.env.BENCH_VARIANTS !== undefined;
  const base = join(RESULTS_DIR, process.env.BENCH_OUT ?? `${results.date}${partial ? '-partial' : ''}`);
  writeFileSync(`${base}.json`, `${JSON.stringify(results, null, 2)}\n`);
  writeFileSync(`${base}.svg`, renderChart(results));
  writeFileSync(`${base}.md`, renderReport(results, `${basename(base)}.svg`));
  console.log('');
  console.log(readFileSync(`${base}.md`, 'utf8').split('\n## What each limiter does')[0]);
  console.log(`wrote ${relative(ROOT, base)}.{json,svg,md} in ${clock(Date.now() - started)}`);
  for (const target of results.targets) {
    console.log(`target ${target.met ? 'met    ' : 'MISSED '} ${target.name}: ${target.goal} (measured ${target.measured})`);
  }
}

for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.once(signal, () => {
    for (const child of children) child.kill('SIGKILL');
    const redis = new Redis(REDIS_URL, { maxRetriesPerRequest: 1 });
    redis.on('error', () => undefined);
    void deleteRunKeys(redis)
      .then((n) => console.error(`bench interrupted; deleted ${n} keys under ${RUN_PREFIX}`))
      .catch(() => console.error(`bench interrupted; keys under ${RUN_PREFIX} may remain`))
      .finally(() => process.exit(130));
  });
}

main().catch((error: unknown) => {
  console.error(error);
  process.exitCode = 1;
});
