import type { ChildProcess } from 'node:child_process';
import { createHash, randomUUID } from 'node:crypto';
import { existsSync, readdirSync, readFileSync, renameSync, statSync, utimesSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { Agent, request as httpRequest } from 'node:http';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import type { Platform } from './app.js';
import { isRunning, killChild, signalChild, spawnChild } from './children.js';
import { IN_FLIGHT_HEADER, SERVED_HEADER } from './worker-app/worker.controller.js';

/**
 * The worker app (test/support/worker-app) in processes of its own. Child processes cannot use
 * ts-jest, and esbuild-style transpilers emit no decorator metadata (constructor injection by type
 * needs it), so the app and the library sources are compiled by tsc into a directory of the test's own.
 */

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const TSC = createRequire(import.meta.url).resolve('typescript/bin/tsc');
const WORKER_TSCONFIG = join(ROOT, 'test/support/worker-app/tsconfig.json');

/** Runs a command to completion; rejects with its output when it fails. */
function run(command: string, args: string[]): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawnChild(command, args, { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] });
    let output = '';
    child.stdout!.on('data', (chunk: Buffer) => (output += chunk.toString()));
    child.stderr!.on('data', (chunk: Buffer) => (output += chunk.toString()));
    child.on('error', reject);
    child.on('exit', (code) =>
      code === 0 ? resolve() : reject(new Error(`${command} ${args.join(' ')} exited with ${code}:\n${output}`)),
    );
  });
}

export interface WorkerBuild {
  /** The compiled entry point. */
  entry: string;
  /** Lets go of the build: a cached one (see buildWorkerApp) stays for the next file and run. */
  remove(): Promise<void>;
}

/** What the worker build is made of: its sources, the library's, the compiler options and the installed versions. */
const BUILD_INPUTS = ['libs/rate-limit/src', 'test/support/worker-app', 'tsconfig.json', 'package-lock.json'];
/** Cached builds nobody used for this long are deleted when a new one is made. */
const STALE_BUILD_MS = 24 * 3600_000;

/** A hash of every file in BUILD_INPUTS (paths and contents): the same hash, the same emitted files. */
function buildInputsHash(): string {
  const hash = createHash('sha256');
  const add = (path: string) => {
    if (statSync(join(ROOT, path)).isDirectory()) {
      for (const name of readdirSync(join(ROOT, path)).sort()) add(join(path, name));
    } else {
      hash
        .update(`${path}\0`)
        .update(readFileSync(join(ROOT, path)))
        .update('\0');
    }
  };
  for (const input of BUILD_INPUTS) add(input);
  return hash.digest('hex').slice(0, 16);
}

/**
 * Compiles the worker app with the library sources into `dist/test-workers/<hash>/` (git-ignored;
 * inside the repo so that bare imports resolve from its node_modules), the hash that of its inputs
 * (BUILD_INPUTS): clock-skew and multi-process, and every later run until a source changes, share one
 * build. It is written to a directory of its own and renamed into place when complete, so a build
 * running at the same time (a parallel test file) never writes into one in use; the loser of such a
 * race uses the winner's. `remove()` keeps the cached build; builds unused for a day are deleted.
 * `--noCheck`: emit only, the same files as with the type-check (the decorator metadata included), in
 * about a third of the CPU time (4 s instead of 12 on two cores); `npm run typecheck` checks these
 * sources with the rest of test/.
 */
export async function buildWorkerApp(): Promise<WorkerBuild> {
  const parent = join(ROOT, 'dist', 'test-workers');
  const outDir = join(parent, `cache-${buildInputsHash()}`);
  const entry = join(outDir, 'test/support/worker-app/main.js');
  const kept = { entry, remove: async () => undefined };
  if (existsSync(entry)) {
    const now = new Date();
    utimesSync(outDir, now, now);
    return kept;
  }
  const building = join(parent, randomUUID().slice(0, 8));
  try {
    await run(process.execPath, [TSC, '-p', WORKER_TSCONFIG, '--noCheck', '--outDir', building]);
    renameSync(building, outDir);
  } catch (error) {
    if (!existsSync(entry)) throw error;
    // Another build of the same sources was renamed into place first.
  } finally {
    await rm(building, { recursive: true, force: true });
  }
  for (const name of readdirSync(parent)) {
    const dir = join(parent, name);
    if (dir !== outDir && name.startsWith('cache-') && Date.now() - statSync(dir).mtimeMs > STALE_BUILD_MS) {
      await rm(dir, { recursive: true, force: true });
    }
  }
  return kept;
}

export interface WorkerOptions {
  redisUrl: string;
  keyPrefix: string;
  platform: Platform;
  /** Shifts `Date.now()` in the worker by this many ms. */
  clockSkewMs?: number;
  /** The module's `timeoutMs` (default 2,000). */
  timeoutMs?: number;
}

/** A running worker app. */
export interface Worker {
  url: string;
  pid: number;
  platform: Platform;
  /** Asks the app to shut down (SIGTERM, shutdown hooks), kills it after 5 s, and waits until it is gone. */
  stop(): Promise<void>;
  /** Kills the app at once (SIGKILL: no shutdown hook runs) and waits until it is gone. */
  kill(): Promise<void>;
}

/** Starts the compiled worker app and resolves when it listens. */
export function startWorker(entry: string, options: WorkerOptions): Promise<Worker> {
  const env: NodeJS.ProcessEnv = {
    ...process.env,
    NODE_OPTIONS: '',
    REDIS_URL: options.redisUrl,
    KEY_PREFIX: options.keyPrefix,
    PLATFORM: options.platform,
    CLOCK_SKEW_MS: String(options.clockSkewMs ?? 0),
    TIMEOUT_MS: String(options.timeoutMs ?? 2_000),
  };
  // Its own process group, recorded: the run's teardown kills it if the test never stops it.
  const child: ChildProcess = spawnChild(process.execPath, [entry], { cwd: ROOT, env, stdio: ['ignore', 'pipe', 'pipe'] });
  let stderr = '';
  child.stderr!.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
  const stop = async () => {
    if (!isRunning(child)) return;
    const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
    signalChild(child, 'SIGTERM');
    const timer = setTimeout(() => signalChild(child, 'SIGKILL'), 5_000);
    await exited;
    clearTimeout(timer);
  };
  return new Promise<Worker>((resolve, reject) => {
    let spawnError: Error | undefined;
    child.once('error', (error) => (spawnError = error));
    const timer = setTimeout(() => {
      reject(new Error(`worker app did not listen within 30 s (killed):\n${stderr}`));
      void killChild(child);
    }, 30_000);
    child.once('exit', (code, signal) => {
      clearTimeout(timer);
      reject(new Error(`worker app exited (${spawnError?.message ?? code ?? signal}) before it listened:\n${stderr}`));
    });
    createInterface({ input: child.stdout! }).on('line', (line) => {
      let ready: { url: string; pid: number };
      try {
        ready = JSON.parse(line) as { url: string; pid: number };
      } catch {
        return; // Not the readiness line.
      }
      clearTimeout(timer);
      // A test that forgets stop() must not keep its jest worker alive: the teardown kills the app.
      child.unref();
      (child.stdout as unknown as { unref?: () => void }).unref?.();
      (child.stderr as unknown as { unref?: () => void }).unref?.();
      resolve({ url: ready.url, pid: ready.pid, platform: options.platform, stop, kill: () => killChild(child) });
    });
  });
}

/**
 * Starts every item with `start` at once and waits until each has started or failed
 * (`Promise.allSettled`). If any failed, stops every one that came up, then rejects with the first
 * failure: a failed start never leaves the others running.
 */
export async function startAll<T extends { stop(): Promise<void> }, O>(
  items: readonly O[],
  start: (item: O) => Promise<T>,
): Promise<Awaited<T>[]> {
  const settled = await Promise.allSettled(items.map((item) => start(item)));
  const failures = settled.filter((s): s is PromiseRejectedResult => s.status === 'rejected');
  const started = settled.filter((s): s is PromiseFulfilledResult<Awaited<T>> => s.status === 'fulfilled').map((s) => s.value);
  if (failures.length === 0) return started;
  await Promise.allSettled(started.map((worker) => worker.stop()));
  const error = failures[0].reason;
  if (failures.length > 1 && error instanceof Error) error.message += `\n(and ${failures.length - 1} more failed to start)`;
  throw error;
}

/** Starts one worker app per options, at once; if any fails, stops the ones that came up (`startAll`). */
export function startWorkers(entry: string, options: readonly WorkerOptions[]): Promise<Worker[]> {
  return startAll(options, (o) => startWorker(entry, o));
}

/** Stops every worker, waiting for all even if some stop fails; rethrows the first failure. */
export async function stopAll(workers: readonly ({ stop(): Promise<void> } | undefined)[]): Promise<void> {
  const settled = await Promise.allSettled(workers.map((w) => w?.stop()));
  const failed = settled.find((s): s is PromiseRejectedResult => s.status === 'rejected');
  if (failed) throw failed.reason;
}

/** Outcome of one GET. */
export interface Reply {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: string;
}

/** Outcomes of one driven run against one worker. */
export interface LoadStats {
  /** 200 with rate-limit headers: the store admitted it. */
  allowed: number;
  /** 429. */
  denied: number;
  /** 200 without rate-limit headers: admitted without a store decision (failureMode 'open'). */
  allowedWithoutDecision: number;
  /** Any other status, or a transport error. */
  failed: string[];
  /** Most requests the worker process held at once (its `x-in-flight` header), counted inside it. */
  maxInFlightAtWorker: number;
}

/** The result of a driven run over all workers. */
export interface LoadRun {
  perUrl: LoadStats[];
  /** From the first request sent to the last response received, on the test's clock. */
  seconds: number;
  /**
   * From the first request a worker received to the last response a worker wrote (their
   * `x-served` stamps): the span that holds every decision, without the test process's own delays.
   */
  servedSeconds: number;
}

/** Keep-alive HTTP clients for a set of worker URLs, and a load generator over them. */
export class LoadDriver {
  private readonly agents = new Map<string, Agent>();

  constructor(
    private readonly urls: readonly string[],
    private readonly socketsPerUrl: number,
  ) {
    for (const url of urls) this.agents.set(url, new Agent({ keepAlive: true, maxSockets: socketsPerUrl }));
  }

  get(url: string, path: string, headers: Record<string, string> = {}): Promise<Reply> {
    return new Promise((resolve, reject) => {
      const req = httpRequest(`${url}${path}`, { agent: this.agents.get(url), headers }, (res) => {
        let body = '';
        res.setEncoding('utf8');
        res.on('data', (chunk: string) => (body += chunk));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body }));
        res.on('error', reject);
      });
      req.on('error', reject);
      req.end();
    });
  }

  /**
   * Keeps `socketsPerUrl` requests in flight against every URL for `durationMs`, then waits for the
   * last ones. `seconds` runs from the first request sent to the last response received.
   */
  async drive(path: string, headers: Record<string, string>, durationMs: number): Promise<LoadRun> {
    const started = performance.now();
    const deadline = started + durationMs;
    let lastEnd = started;
    let firstReceived = Infinity;
    let lastResponded = -Infinity;
    const perUrl = await Promise.all(
      this.urls.map(async (url) => {
        const stats: LoadStats = { allowed: 0, denied: 0, allowedWithoutDecision: 0, failed: [], maxInFlightAtWorker: 0 };
        const lane = async () => {
          while (performance.now() < deadline) {
            try {
              const reply = await this.get(url, path, headers);
              const served = reply.headers[SERVED_HEADER];
              if (typeof served === 'string') {
                const [received, responded] = served.split(' ').map(Number);
                firstReceived = Math.min(firstReceived, received);
                lastResponded = Math.max(lastResponded, responded);
              }
              const inFlight = Number(reply.headers[IN_FLIGHT_HEADER]);
              if (inFlight > stats.maxInFlightAtWorker) stats.maxInFlightAtWorker = inFlight;
              if (reply.status === 200 && reply.headers['x-ratelimit-limit'] !== undefined) stats.allowed++;
              else if (reply.status === 200) stats.allowedWithoutDecision++;
              else if (reply.status === 429) stats.denied++;
              else stats.failed.push(`${reply.status} ${reply.body.slice(0, 200)}`);
            } catch (error) {
              stats.failed.push((error as Error).message);
            } finally {
              lastEnd = Math.max(lastEnd, performance.now());
            }
          }
        };
        await Promise.all(Array.from({ length: this.socketsPerUrl }, lane));
        return stats;
      }),
    );
    return {
      perUrl,
      seconds: (lastEnd - started) / 1000,
      servedSeconds: lastResponded > firstReceived ? (lastResponded - firstReceived) / 1000 : NaN,
    };
  }

  close(): void {
    for (const agent of this.agents.values()) agent.destroy();
  }
}
