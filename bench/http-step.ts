import { spawn } from 'node:child_process';
import { readFileSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import autocannon from 'autocannon';
import type { ChildProcess } from 'node:child_process';
import type { Redis } from 'ioredis';
import { fmt, HERE, progress, rotate, stopChild, track } from './processes.js';
import { commandStats, type CommandStats, redisCpuSeconds, scanKeys, scriptCost } from './redis.js';
import type { BenchResults, HttpRun, HttpSummary } from './results.js';
import { HTTP_FLOORS, HTTP_PATHS, type HttpPath, type HttpVariant, LIMITS, SETTINGS } from './settings.js';
import { quantile, round, spreadOf } from './stats.js';

/**
 * The HTTP step: one Nest app process per variant, autocannon from this process, variants interleaved
 * (rotated order) over rounds; every figure also as a ratio to "no limiter" and to the path's floor in
 * the same round. BENCH_PROFILE=<variant> starts that app with --cpu-prof (profiles in .bench-tmp/profiles).
 */

const PROFILE = process.env.BENCH_PROFILE;
/** USER_HZ: the unit of utime and stime in /proc/<pid>/stat (100 on every common Linux). */
const CLOCK_TICKS = 100;

interface App {
  variant: HttpVariant;
  child: ChildProcess;
  url: string;
}

async function startApp(variant: HttpVariant, prefix: string, root: string): Promise<App> {
  const args = [join(HERE, 'http-app.js'), variant, prefix];
  if (PROFILE === variant) {
    const dir = join(root, '.bench-tmp', 'profiles');
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
async function checkApp(app: App, redis: Redis, keyPattern: string): Promise<string> {
  const first = await fetch(`${app.url}/allowed`);
  if (first.status !== 200) throw new Error(`${app.variant}: GET /allowed answered ${first.status}`);
  const statuses: number[] = [];
  for (let i = 0; i < LIMITS.denied.capacity + 5; i++) statuses.push((await fetch(`${app.url}/denied`)).status);
  const denied = statuses.filter((s) => s === 429).length;
  const keys = await scanKeys(redis, keyPattern);
  if (app.variant === 'none') {
    if (denied !== 0) throw new Error('none: /denied answered 429');
    return 'no limit, no keys';
  }
  if (app.variant === 'throw-only' || app.variant === 'throw-later') {
    if (denied !== statuses.length || keys.length !== 0)
      throw new Error(`${app.variant}: statuses ${statuses.join(',')}, ${keys.length} keys`);
    return `every /denied refused, no keys`;
  }
  if (denied === 0 || keys.length === 0) {
    throw new Error(`${app.variant}: /denied never answered 429 (statuses ${statuses.join(',')}; ${keys.length} keys in Redis)`);
  }
  return `${first.headers.get('x-ratelimit-limit') ?? '?'} limit header, ${denied}/${statuses.length} of a burst denied, ${keys.length} keys in Redis`;
}

/** CPU seconds (user + system) a process has used so far; NaN where /proc is not available. */
export function processCpuSeconds(pid: number | undefined): number {
  try {
    const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
    return (Number(fields[11]) + Number(fields[12])) / CLOCK_TICKS;
  } catch {
    return Number.NaN;
  }
}

/** autocannon for `seconds`; latencies of every answer (2xx or not) kept at sub-ms resolution. */
async function load(url: string, seconds: number) {
  const latencies: number[] = [];
  const instance = autocannon({ url, connections: SETTINGS.connections, duration: seconds });
  instance.on('response', (_client, _status, _bytes, responseTime) => latencies.push(responseTime));
  const result = await instance;
  return { result, p50Ms: quantile(latencies, 0.5), p99Ms: quantile(latencies, 0.99) };
}

export interface HttpStep {
  runs: HttpRun[];
  summary: BenchResults['http']['summary'];
  checks: Record<string, string>;
}

export function httpPlannedSeconds(): number {
  const measurements = Object.values(HTTP_PATHS).reduce((n, list) => n + list.length, 0) * SETTINGS.httpRounds;
  return 8 + measurements * (SETTINGS.httpWarmupSeconds + SETTINGS.httpSeconds + 0.3);
}

/**
 * The commands the library's scripts call: INFO commandstats counts them on their own as well as
 * inside the script's own time, so they are left out of the sums below (no double count).
 */
const CALLED_BY_SCRIPTS = new Set(['hmget', 'hset', 'pexpire', 'pttl', 'time', 'hgetall', 'hget', 'hdel']);

/** µs Redis spent in commands between two INFO commandstats readings: scripts whole, INFO (the bench's own) and what scripts call left out. */
function commandUsec(before: CommandStats, after: CommandStats): number {
  let usec = 0;
  for (const [name, a] of after) {
    if (name === 'info' || CALLED_BY_SCRIPTS.has(name)) continue;
    usec += a.usec - (before.get(name)?.usec ?? 0);
  }
  return usec;
}

export async function httpStep(redis: Redis, runPrefix: string, root: string): Promise<HttpStep> {
  const variants = [...new Set(Object.values(HTTP_PATHS).flat())];
  const t0 = Date.now();
  const apps = new Map<HttpVariant, App>();
  const prefixOf = (variant: HttpVariant) => `${runPrefix}http:${variant}:`;
  for (const variant of variants) apps.set(variant, await startApp(variant, prefixOf(variant), root));
  const checks: Record<string, string> = {};
  for (const app of apps.values()) checks[app.variant] = await checkApp(app, redis, `${prefixOf(app.variant)}*`);
  progress(
    'http',
    `started ${apps.size} apps; checks: ${Object.entries(checks)
      .map(([v, c]) => `${v}: ${c}`)
      .join('; ')}`,
    Date.now() - t0,
  );

  const runs: HttpRun[] = [];
  const perRun = SETTINGS.httpWarmupSeconds + SETTINGS.httpSeconds + 0.3;
  const total = SETTINGS.httpRounds * Object.values(HTTP_PATHS).reduce((n, list) => n + list.length, 0);
  for (let r = 0; r < SETTINGS.httpRounds; r++) {
    for (const path of Object.keys(HTTP_PATHS) as HttpPath[]) {
      const inRound: HttpRun[] = [];
      for (const variant of rotate(HTTP_PATHS[path], r)) {
        const t = Date.now();
        const url = `${apps.get(variant)!.url}/${path}`;
        if (SETTINGS.httpWarmupSeconds > 0)
          await autocannon({ url, connections: SETTINGS.connections, duration: SETTINGS.httpWarmupSeconds });
        const app = apps.get(variant)!.child;
        const appCpu0 = processCpuSeconds(app.pid);
        const redisCpu0 = await redisCpuSeconds(redis);
        const stats0 = await commandStats(redis);
        const { result, p50Ms, p99Ms } = await load(url, SETTINGS.httpSeconds);
        const appCpu = processCpuSeconds(app.pid) - appCpu0;
        const redisCpu = (await redisCpuSeconds(redis)) - redisCpu0;
        const stats1 = await commandStats(redis);
        const commandUs = commandUsec(stats0, stats1);
        const otherUs = commandUs - scriptCost(stats0, stats1).usec;
        const answered = result['2xx'] + result.non2xx;
        const run: HttpRun = {
          round: r + 1,
          path,
          variant,
          requestsPerSecond: result.requests.average,
          p50Ms: round(p50Ms, 3),
          p99Ms: round(p99Ms, 3),
          status2xx: result['2xx'],
          statusNon2xx: result.non2xx,
          errors: result.errors + result.timeouts,
          appCpuUsPerRequest: round((appCpu * 1e6) / Math.max(1, answered), 1),
          redisCpuUsPerRequest: round((redisCpu * 1e6) / Math.max(1, answered), 1),
          redisCommandUsPerRequest: round(commandUs / Math.max(1, answered), 2),
          redisOtherCommandUsPerRequest: round(otherUs / Math.max(1, answered), 3),
          ratio: Number.NaN,
          ratioToFloor: Number.NaN,
          p99AddedMs: Number.NaN,
        };
        inRound.push(run);
        runs.push(run);
        progress(
          `http ${runs.length}/${total}`,
          `round ${r + 1} ${path} ${variant}: ${fmt(run.requestsPerSecond)} req/s, p50 ${run.p50Ms.toFixed(2)} ms, p99 ${run.p99Ms.toFixed(2)} ms, ` +
            `${fmt(run.status2xx)} 2xx / ${fmt(run.statusNon2xx)} other${run.errors ? `, ${run.errors} errors` : ''}; ` +
            `CPU per request: app ${run.appCpuUsPerRequest} µs, Redis ${run.redisCpuUsPerRequest} µs ` +
            `(commands ${run.redisCommandUsPerRequest} µs, not scripts ${run.redisOtherCommandUsPerRequest} µs)`,
          Date.now() - t,
          perRun,
        );
      }
      const none = inRound.find((run) => run.variant === 'none')!;
      const floor = inRound.find((run) => run.variant === HTTP_FLOORS[path]);
      for (const run of inRound) {
        run.ratio = round(run.requestsPerSecond / none.requestsPerSecond, 4);
        run.ratioToFloor = floor ? round(run.requestsPerSecond / floor.requestsPerSecond, 4) : Number.NaN;
        run.p99AddedMs = round(run.p99Ms - none.p99Ms, 3);
      }
      console.log(
        `         round ${r + 1} ${path} ratios to no limiter: ${inRound.map((run) => `${run.variant} ${run.ratio.toFixed(3)}`).join(', ')}`,
      );
    }
  }
  await Promise.all([...apps.values()].map((app) => stopChild(app.child)));
  return { runs, summary: summarize(runs), checks };
}

function summarize(runs: readonly HttpRun[]): BenchResults['http']['summary'] {
  const summary = { allowed: {}, denied: {} } as BenchResults['http']['summary'];
  for (const path of Object.keys(HTTP_PATHS) as HttpPath[]) {
    for (const variant of HTTP_PATHS[path]) {
      const mine = runs.filter((run) => run.path === path && run.variant === variant);
      if (mine.length === 0) continue;
      const of = (field: keyof HttpRun, digits: number) =>
        spreadOf(
          mine.map((run) => run[field] as number),
          digits,
        );
      const answered = mine.reduce((n, run) => n + run.status2xx + run.statusNon2xx, 0);
      const s: HttpSummary = {
        requestsPerSecond: of('requestsPerSecond', 0),
        p50Ms: of('p50Ms', 2),
        p99Ms: of('p99Ms', 2),
        p99AddedMs: of('p99AddedMs', 2),
        ratio: of('ratio', 3),
        ratioToFloor: of('ratioToFloor', 3),
        share2xx: round(mine.reduce((n, run) => n + run.status2xx, 0) / Math.max(1, answered), 4),
        appCpuUsPerRequest: of('appCpuUsPerRequest', 1),
        redisCpuUsPerRequest: of('redisCpuUsPerRequest', 1),
        redisCommandUsPerRequest: of('redisCommandUsPerRequest', 2),
        redisOtherCommandUsPerRequest: of('redisOtherCommandUsPerRequest', 3),
      };
      summary[path][variant] = s;
    }
  }
  return summary;
}
