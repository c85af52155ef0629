import { type ChildProcess, execFile, execFileSync, spawn } from 'node:child_process';
import { mkdirSync, readFileSync, rmSync } from 'node:fs';
import { Agent, get } from 'node:http';
import { join, relative, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { promisify } from 'node:util';
import { benchBeside } from './library-builds.js';
import { fmt, HERE, progress, stopChild, track } from './processes.js';
import type { HttpPath, HttpVariant } from './settings.js';
import { INSTRUCTIONS, LABELS } from './settings.js';
import { round } from './stats.js';

/**
 * The instructions step (BENCH_ONLY=instructions; not in the default run: 5-7 minutes on 2 shared cores): instructions the app
 * process executes per request, counted by valgrind's callgrind. Unlike req/s on a shared machine,
 * a count moves by a few parts per thousand from run to run, so a change of a few percent is visible.
 *
 * Each app (bench/http-app.js, the same app as the HTTP step) runs under
 * `valgrind --tool=callgrind --instr-atstart=no`: nothing is counted during start-up. The bench
 * process (not under valgrind) is the client: one keep-alive connection, one request at a time.
 *
 * 1. Warm-up: `warmup` requests, alternating over the app's measured paths (so the JIT sees every
 *    path before any is measured); then instrumentation is switched on (`callgrind_control -i on`).
 * 2. For each path: counters zeroed (`callgrind_control -z`), N requests, dump (`callgrind_control -d`):
 *    I(N); N more requests, dump: I(2N) is the sum of both dumps. Instructions per request =
 *    (I(2N) − I(N)) / N, the cost of requests N+1..2N: what the first N requests of a path do once
 *    (JIT still at work, the switch from another path) is in I(N) and I(2N) alike, and cancels.
 * 3. Every app runs `repeats` times, each in a new process; the report gives the median and the spread.
 *
 * Node runs with --single-threaded (the JIT compiles on the main thread, at a point that does not
 * depend on thread scheduling), fixed hash and random seeds, a fixed young generation of 1 MB and an
 * old generation that starts at 512 MB (with --predictable-gc-schedule instead, two processes differed by 2-4 %).
 *
 * BENCH_LIBRARY_DIR=<dir of a built nest-redis-rate-limit package (package.json + dist)>: the apps
 * load that library instead of libs/rate-limit. The package and this bench's compiled files are copied
 * under .bench-tmp/instructions/library/, so the library resolves @nestjs/*, ioredis, ... from this
 * tree's node_modules (the app and the library share one Nest). bench/compare-instructions.ts builds a
 * commit's library that way and compares two.
 */

const run = promisify(execFile);

/** What is measured: the path of an app. */
export interface InstructionsTarget {
  variant: HttpVariant;
  path: HttpPath;
  /** The status every measured request must get. */
  status: number;
}

export const INSTRUCTION_TARGETS: readonly InstructionsTarget[] = [
  { variant: 'none', path: 'allowed', status: 200 },
  { variant: 'minimal-guard', path: 'allowed', status: 200 },
  { variant: 'throw-only', path: 'denied', status: 429 },
  { variant: 'ours', path: 'allowed', status: 200 },
  { variant: 'ours', path: 'denied', status: 429 },
  { variant: 'ours-operations', path: 'allowed', status: 200 },
];

export const targetKey = (t: { variant: HttpVariant; path: HttpPath }) => `${t.variant} /${t.path}`;

export interface InstructionsRun {
  variant: HttpVariant;
  path: HttpPath;
  repeat: number;
  /** Instructions counted over the first N requests of the path, and over the first 2N. */
  instructionsN: number;
  instructions2N: number;
  /** (I(2N) − I(N)) / N. */
  perRequest: number;
  /** I(N) / N: differs from perRequest by what the first N requests do once (JIT still at work). */
  perRequestFirstN: number;
}

export interface InstructionsSummary {
  variant: HttpVariant;
  path: HttpPath;
  median: number;
  min: number;
  max: number;
  /** (max − min) / median, in percent. */
  spreadPercent: number;
  n: number;
}

export interface InstructionsResult {
  /** The library measured: a commit of this tree, or BENCH_LIBRARY_DIR. */
  code: string;
  library: string;
  settings: { warmup: number; n: number; repeats: number; parallel: number };
  valgrind: string;
  nodeFlags: string[];
  valgrindFlags: string[];
  runs: InstructionsRun[];
  summary: InstructionsSummary[];
  /** Each path over its floor's median ("none" for the floors). */
  ratios: Record<string, number>;
  durationSeconds: number;
}

/** BENCH_INSTR_NODE_FLAGS (space-separated) replaces them. */
const NODE_FLAGS = [
  ...(process.env.BENCH_INSTR_NODE_FLAGS?.split(' ').filter(Boolean) ?? [
    '--single-threaded',
    '--hash-seed=1',
    '--random-seed=1',
    // A young generation of a fixed 1 MB: a scavenge every few requests, so that N requests hold many and
    // where the next one falls hardly matters (with 64 MB one scavenge fell in or out of a segment: ±15 %).
    // The old generation starts at 512 MB: no full GC during the step.
    '--min-semi-space-size=1',
    '--max-semi-space-size=1',
    '--initial-old-space-size=512',
  ]),
];
const VALGRIND_FLAGS = ['--tool=callgrind', '--instr-atstart=no', '--smc-check=all-non-file'];

export function instructionsPlannedSeconds(): number {
  const { warmup, n, repeats, parallel } = INSTRUCTIONS;
  const apps = new Set(INSTRUCTION_TARGETS.map((t) => t.variant));
  // Measured under valgrind on a shared 2-core machine: about 15 s to start, 4 ms per warm-up request, 15 ms per counted one.
  const perApp = [...apps].map((v) => 15 + warmup * 0.004 + INSTRUCTION_TARGETS.filter((t) => t.variant === v).length * 2 * n * 0.015);
  return (perApp.reduce((a, b) => a + b, 0) * repeats) / Math.max(1, parallel);
}

/** One HTTP GET on the keep-alive agent; resolves with the status. */
function request(agent: Agent, port: number, path: string): Promise<number> {
  return new Promise((done, fail) => {
    get({ host: '127.0.0.1', port, path, agent }, (res) => {
      res.resume();
      res.once('end', () => done(res.statusCode ?? 0));
    }).once('error', fail);
  });
}

async function requests(agent: Agent, port: number, path: string, count: number, status?: number): Promise<void> {
  for (let i = 0; i < count; i++) {
    const got = await request(agent, port, path);
    if (status !== undefined && got !== status)
      throw new Error(`GET ${path}: status ${got}, expected ${status} for every measured request`);
  }
}

async function control(pid: number, ...args: string[]): Promise<void> {
  const { stdout } = await run('callgrind_control', [...args, String(pid)], { timeout: 120_000 });
  if (!stdout.includes('OK')) throw new Error(`callgrind_control ${args.join(' ')} ${pid}: ${stdout.trim()}`);
}

function totalOf(file: string): number {
  const match = /^totals:\s+(\d+)/m.exec(readFileSync(file, 'utf8')) ?? /^summary:\s+(\d+)/m.exec(readFileSync(file, 'utf8'));
  if (!match) throw new Error(`no totals in ${file}`);
  return Number(match[1]);
}

/** The app's stdout, line by line, as JSON objects. */
function lineReader(child: ChildProcess) {
  const waiting: Array<(line: Record<string, number>) => void> = [];
  const lines = createInterface({ input: child.stdout! });
  lines.on('line', (line) => {
    let parsed: Record<string, number>;
    try {
      parsed = JSON.parse(line) as Record<string, number>;
    } catch {
      return;
    }
    waiting.shift()?.(parsed);
  });
  return (what: string, timeoutMs: number) =>
    new Promise<Record<string, number>>((done, fail) => {
      const timer = setTimeout(() => fail(new Error(`app: no ${what} within ${timeoutMs / 1000} s`)), timeoutMs);
      const onExit = (code: number | null) => fail(new Error(`app exited with ${code} while waiting for ${what}`));
      child.once('exit', onExit);
      waiting.push((line) => {
        clearTimeout(timer);
        child.off('exit', onExit);
        done(line);
      });
    });
}

/** Where the apps' compiled files are: dist/bench, or a copy beside BENCH_LIBRARY_DIR's package (`benchBeside`). */
function appDir(root: string): { dir: string; library: string } {
  const libraryDir = process.env.BENCH_LIBRARY_DIR;
  if (!libraryDir) return { dir: HERE, library: 'libs/rate-limit (this tree)' };
  const source = resolve(libraryDir);
  const dir = benchBeside(source, join(root, '.bench-tmp', 'instructions', 'library'));
  return { dir, library: relative(root, source) || source };
}

interface Job {
  variant: HttpVariant;
  repeat: number;
  targets: InstructionsTarget[];
}

async function measureApp(job: Job, dir: string, runPrefix: string, workDir: string): Promise<InstructionsRun[]> {
  const { warmup, n } = INSTRUCTIONS;
  const outDir = join(workDir, `${job.variant}-${job.repeat}`);
  rmSync(outDir, { recursive: true, force: true });
  mkdirSync(outDir, { recursive: true });
  const outFile = join(outDir, 'callgrind.out');
  const args = [...VALGRIND_FLAGS, `--callgrind-out-file=${outFile}`, `--log-file=${join(outDir, 'valgrind.log')}`];
  args.push(process.execPath, ...NODE_FLAGS, join(dir, 'http-app.js'), job.variant, `${runPrefix}instr:${job.variant}:${job.repeat}:`);
  // timeoutMs 60 s for ours: with the default 100 ms the deadline's timer fires every 100 ms of wall time,
  // and under valgrind that is a different share of requests in every process (allowed: 10 % apart).
  const env = { ...process.env, BENCH_DENIED_LIMITS: 'no-refill', BENCH_OURS_TIMEOUT_MS: '60000' };
  const child = track(spawn('valgrind', args, { env, stdio: ['ignore', 'pipe', 'inherit'] }));
  // A new connection for the warm-up and for each segment: during callgrind_control the server's
  // keep-alive timeout (5 s) may close an idle one. Opening one costs the app a few tens of thousands of
  // instructions, under 0.01 % of N requests.
  let agent = new Agent({ keepAlive: true, maxSockets: 1 });
  try {
    const next = lineReader(child);
    const { port } = await next('port', 180_000);
    const pid = child.pid!;
    for (let i = 0; i < warmup; i++) {
      const t = job.targets[i % job.targets.length];
      await request(agent, port, `/${t.path}`);
    }
    await control(pid, '-i', 'on');
    let dumps = 0;
    const segment = async (path: string, count: number, status: number): Promise<number> => {
      agent.destroy();
      agent = new Agent({ keepAlive: true, maxSockets: 1 });
      await control(pid, '-z');
      await requests(agent, port, path, count, status);
      await control(pid, '-d');
      return totalOf(`${outFile}.${++dumps}`);
    };
    const runs: InstructionsRun[] = [];
    for (const t of job.targets) {
      const instructionsN = await segment(`/${t.path}`, n, t.status);
      const instructions2N = instructionsN + (await segment(`/${t.path}`, n, t.status));
      runs.push({
        variant: t.variant,
        path: t.path,
        repeat: job.repeat,
        instructionsN,
        instructions2N,
        perRequest: round((instructions2N - instructionsN) / n),
        perRequestFirstN: round(instructionsN / n),
      });
    }
    return runs;
  } finally {
    agent.destroy();
    await stopChild(child, 'SIGKILL');
    if (process.env.BENCH_INSTR_KEEP !== '1') rmSync(outDir, { recursive: true, force: true });
  }
}

function code(root: string): string {
  if (process.env.BENCH_CODE) return process.env.BENCH_CODE;
  if (process.env.BENCH_LIBRARY_DIR) return `BENCH_LIBRARY_DIR=${process.env.BENCH_LIBRARY_DIR}`;
  try {
    const head = execFileSync('git', ['rev-parse', '--short', 'HEAD'], { cwd: root, encoding: 'utf8' }).trim();
    const dirty = execFileSync('git', ['status', '--porcelain', '--', 'libs'], { cwd: root, encoding: 'utf8' }).trim();
    return dirty ? `${head} with uncommitted changes in libs/` : head;
  } catch {
    return 'unknown (not a git checkout; set BENCH_CODE)';
  }
}

export function summarize(runs: readonly InstructionsRun[]): { summary: InstructionsSummary[]; ratios: Record<string, number> } {
  const summary: InstructionsSummary[] = [];
  for (const t of INSTRUCTION_TARGETS) {
    const values = runs.filter((r) => r.variant === t.variant && r.path === t.path).map((r) => r.perRequest);
    if (values.length === 0) continue;
    const sorted = [...values].sort((a, b) => a - b);
    const mid = sorted.length >> 1;
    const median = sorted.length % 2 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
    summary.push({
      variant: t.variant,
      path: t.path,
      median: round(median),
      min: sorted[0],
      max: sorted[sorted.length - 1],
      spreadPercent: round(((sorted[sorted.length - 1] - sorted[0]) / median) * 100, 2),
      n: values.length,
    });
  }
  const ratios: Record<string, number> = {};
  const find = (variant: HttpVariant, path: HttpPath) => summary.find((s) => s.variant === variant && s.path === path)?.median;
  const floors: Record<HttpPath, HttpVariant> = { allowed: 'minimal-guard', denied: 'throw-only' };
  for (const s of summary) {
    const floor = s.variant === 'none' || s.variant === floors[s.path] ? 'none' : floors[s.path];
    const base = floor === 'none' ? find('none', 'allowed') : find(floor, s.path);
    if (base && s.variant !== 'none') ratios[targetKey(s)] = round(s.median / base, 3);
  }
  return { summary, ratios };
}

export async function instructionsStep(runPrefix: string, root: string): Promise<InstructionsResult> {
  const t0 = Date.now();
  const { repeats, parallel } = INSTRUCTIONS;
  const valgrind = execFileSync('valgrind', ['--version'], { encoding: 'utf8' }).trim();
  const { dir, library } = appDir(root);
  const workDir = join(root, '.bench-tmp', 'instructions', 'callgrind');
  mkdirSync(workDir, { recursive: true });
  const only = process.env.BENCH_INSTR_VARIANTS?.split(',').map((s) => s.trim());
  const variants = [...new Set(INSTRUCTION_TARGETS.map((t) => t.variant))].filter((v) => !only || only.includes(v));
  const jobs: Job[] = [];
  for (let repeat = 1; repeat <= repeats; repeat++) {
    for (const variant of variants) jobs.push({ variant, repeat, targets: INSTRUCTION_TARGETS.filter((t) => t.variant === variant) });
  }
  const runs: InstructionsRun[] = [];
  let done = 0;
  const worker = async () => {
    for (let job = jobs.shift(); job; job = jobs.shift()) {
      const t = Date.now();
      const measured = await measureApp(job, dir, runPrefix, workDir);
      runs.push(...measured);
      done++;
      progress(
        `instructions ${done}/${variants.length * repeats}`,
        `${job.variant} #${job.repeat}: ${measured.map((r) => `/${r.path} ${fmt(r.perRequest)} per request (first N: ${fmt(r.perRequestFirstN)})`).join(', ')}`,
        Date.now() - t,
      );
    }
  };
  await Promise.all(Array.from({ length: Math.max(1, parallel) }, worker));
  runs.sort((a, b) => targetKey(a).localeCompare(targetKey(b)) || a.repeat - b.repeat);
  const { summary, ratios } = summarize(runs);
  if (process.env.BENCH_INSTR_KEEP !== '1') rmSync(workDir, { recursive: true, force: true });
  return {
    code: code(root),
    library,
    settings: { ...INSTRUCTIONS },
    valgrind,
    nodeFlags: NODE_FLAGS,
    valgrindFlags: VALGRIND_FLAGS,
    runs,
    summary,
    ratios,
    durationSeconds: round((Date.now() - t0) / 1000, 1),
  };
}

const SHORT: Partial<Record<HttpVariant, string>> = { none: 'no limiter', ours: 'ours' };

/** The step's markdown section (heading level `h`). */
export function renderInstructions(result: InstructionsResult, h = '##'): string {
  const s = result.settings;
  const lines: string[] = [];
  lines.push(`${h} Instructions per request (callgrind)`, '');
  lines.push(
    `Code: ${result.code}; library: ${result.library}. ${result.valgrind}, node ${result.nodeFlags.join(' ')}. ` +
      `Warm-up ${fmt(s.warmup)} requests per app, then per path (I(2N) − I(N)) / N with N = ${fmt(s.n)}: the cost of requests N+1..2N of the path; ` +
      `one request at a time on one keep-alive connection; ${s.repeats} processes per app. The step took ${round(result.durationSeconds / 60, 1)} min.`,
    '',
  );
  lines.push('| path | variant | instructions per request: median (min–max) | spread | × floor |', '|---|---|---:|---:|---:|');
  for (const r of result.summary) {
    const label = SHORT[r.variant] ?? LABELS[r.variant];
    const ratio = result.ratios[targetKey(r)];
    lines.push(
      `| /${r.path} | ${label} | ${fmt(r.median)} (${fmt(r.min)}–${fmt(r.max)}) | ${r.spreadPercent.toFixed(2)} % | ${ratio === undefined ? '' : `${ratio.toFixed(3)}`} |`,
    );
  }
  lines.push('');
  lines.push(
    '"× floor": over the minimal guard (allowed) or the throw-only guard (denied); the floors themselves over "no limiter". ' +
      '/denied here refills one token per 10,000 s (BENCH_DENIED_LIMITS=no-refill), so every measured request of ours is refused by its deny cache.',
    '',
  );
  lines.push('Each process: I(N) / N beside (I(2N) − I(N)) / N (their difference is what the first N requests of a path do once):', '');
  lines.push('| path | variant | # | I(N) / N | (I(2N) − I(N)) / N |', '|---|---|---:|---:|---:|');
  for (const r of result.runs) {
    lines.push(`| /${r.path} | ${SHORT[r.variant] ?? r.variant} | ${r.repeat} | ${fmt(r.perRequestFirstN)} | ${fmt(r.perRequest)} |`);
  }
  lines.push('');
  return lines.join('\n');
}
