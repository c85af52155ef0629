import { type ChildProcess, fork } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

/** Child processes of the run, progress lines, and small helpers the steps share. */

export const HERE = dirname(fileURLToPath(import.meta.url));

const children = new Set<ChildProcess>();

export function track(child: ChildProcess): ChildProcess {
  children.add(child);
  child.once('exit', () => children.delete(child));
  return child;
}

export function liveChildren(): ChildProcess[] {
  return [...children];
}

export async function stopChild(child: ChildProcess, signal: NodeJS.Signals = 'SIGTERM'): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise<void>((done) => child.once('exit', () => done()));
  child.kill(signal);
  const timer = setTimeout(() => child.kill('SIGKILL'), 5_000);
  await exited;
  clearTimeout(timer);
}

/**
 * A worker script of dist/bench (or of `dir`: a copy of the bench beside another build of the library,
 * library-builds.ts), with IPC; it inherits the environment (BENCH_REDIS_URL).
 */
export function forkWorker(file: string, args: string[], dir = HERE): ChildProcess {
  return track(fork(join(dir, file), args, { stdio: ['ignore', 'inherit', 'inherit', 'ipc'] }));
}

export function nextMessage<T>(child: ChildProcess, what: string, timeoutMs = 60_000): Promise<T> {
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

/** `items` rotated left by `by`: each round starts with a different variant. */
export function rotate<T>(items: readonly T[], by: number): T[] {
  const k = by % items.length;
  return [...items.slice(k), ...items.slice(0, k)];
}

export const fmt = (n: number) => Math.round(n).toLocaleString('en-US');

function clock(ms: number): string {
  const s = Math.max(0, Math.round(ms / 1000));
  return `${Math.floor(s / 60)}:${String(s % 60).padStart(2, '0')}`;
}

const started = Date.now();
let plannedSeconds = 0;
let doneSeconds = 0;

export const elapsed = () => clock(Date.now() - started);
export const startedAt = started;

export function planSeconds(seconds: number): string {
  plannedSeconds = seconds;
  return clock(seconds * 1000);
}

/** One progress line: what finished, how long it took, and how long the run has left (estimated). */
export function progress(step: string, message: string, tookMs: number, plannedForIt = 0): void {
  doneSeconds += plannedForIt;
  const left = Math.max(0, plannedSeconds - doneSeconds);
  console.log(`[${step}] ${message} (${(tookMs / 1000).toFixed(1)} s; ${elapsed()} elapsed, ~${clock(left * 1000)} left)`);
}
