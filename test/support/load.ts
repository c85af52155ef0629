import { readFileSync } from 'node:fs';
import { PerformanceObserver, performance } from 'node:perf_hooks';

/** One request of a load run, as the client saw it. Times are `performance.now()` ms. */
export interface Answer {
  /** HTTP status, or 0 when no answer came (connection error or the client's own 5 s limit). */
  status: number;
  startedAt: number;
  endedAt: number;
  retryAfter: string | null;
  remaining: string | null;
  /** X-RateLimit-Limit. */
  limit?: string | null;
  /** The response body (its first 1000 characters). */
  body?: string;
  error?: string;
}

/**
 * Sends one GET and records how it went; never throws. `timeoutMs` is the client's own limit (default
 * 5 s): past it the answer has status 0.
 */
export async function timedGet(url: string, headers: Record<string, string> = {}, timeoutMs = 5_000): Promise<Answer> {
  const startedAt = performance.now();
  try {
    const response = await fetch(url, { headers, signal: AbortSignal.timeout(timeoutMs) });
    const body = (await response.text()).slice(0, 1000);
    return {
      body,
      status: response.status,
      startedAt,
      endedAt: performance.now(),
      retryAfter: response.headers.get('retry-after'),
      remaining: response.headers.get('x-ratelimit-remaining'),
      limit: response.headers.get('x-ratelimit-limit'),
    };
  } catch (error) {
    return {
      status: 0,
      startedAt,
      endedAt: performance.now(),
      retryAfter: null,
      remaining: null,
      error: describeError(error),
    };
  }
}

/** An error's message, and its cause's (fetch says only "fetch failed"; the cause says why). */
function describeError(error: unknown): string {
  if (!(error instanceof Error)) return String(error);
  const cause = error.cause as { code?: string; message?: string } | undefined;
  return cause === undefined ? `${error.name}: ${error.message}` : `${error.name}: ${error.message} (${cause.code ?? cause.message})`;
}

export interface LoadOptions {
  /** Headers of every request, or of the n-th request (from 0) of the whole load. */
  headers?: Record<string, string> | ((n: number) => Record<string, string>);
  /**
   * Pause of each worker between an answer and its next request, in ms. Client and app share one
   * process on a shared machine: without a pause the load saturates the CPU and the latencies measure
   * the queue, not the limiter. Default 0.
   */
  thinkMs?: number;
  /** The load stops by itself after this long, so a failed test cannot leave it running. Default 10 s. */
  maxMs?: number;
  /** The client's limit on each request (`timedGet`). Default 5 s. */
  clientTimeoutMs?: number;
}

/**
 * `workers` loops, each sending its next request when its last is answered (and `thinkMs` passed),
 * until `stop()`; `done` resolves with every answer once the last one is in.
 */
export function startLoad(
  url: string,
  workers: number,
  { headers = {}, thinkMs = 0, maxMs = 10_000, clientTimeoutMs = 5_000 }: LoadOptions = {},
): { stop: () => void; done: Promise<Answer[]>; answers: Answer[] } {
  const answers: Answer[] = [];
  let running = true;
  const deadline = performance.now() + maxMs;
  let sent = 0;
  const worker = async () => {
    while (running && performance.now() < deadline) {
      const answer = await timedGet(url, typeof headers === 'function' ? headers(sent++) : headers, clientTimeoutMs);
      answers.push(answer);
      // A closed app refuses at once: do not spin.
      const pause = answer.status === 0 ? Math.max(thinkMs, 10) : thinkMs;
      if (pause > 0) await sleep(pause);
    }
  };
  const stop = () => {
    running = false;
    loads.delete(stop);
  };
  loads.add(stop);
  const done = Promise.all(Array.from({ length: workers }, worker)).then(() => answers);
  return { stop, done, answers };
}

const loads = new Set<() => void>();

/** Stops every load still running, e.g. in `afterAll` after a failed test. */
export function stopAllLoads(): void {
  for (const stop of [...loads]) stop();
}

/** Requests that were sent before `at` and answered after it. */
export function inFlightAt(answers: readonly Answer[], at: number): number {
  return answers.filter((a) => a.startedAt <= at && a.endedAt >= at).length;
}

/** The slowest answer, in ms. */
export function slowest(answers: readonly Answer[]): number {
  return Math.max(...answers.map((a) => a.endedAt - a.startedAt));
}

/** Answer counts by status, e.g. `{ 200: 10, 429: 5 }`. */
export function countByStatus(answers: readonly Answer[]): Record<number, number> {
  const counts: Record<number, number> = {};
  for (const a of answers) counts[a.status] = (counts[a.status] ?? 0) + 1;
  return counts;
}

export const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/** What this process did over a span of time, in ms. */
export interface CpuShare {
  /** The main thread on a CPU (Linux; 0 elsewhere). */
  ran: number;
  /** The main thread runnable, but waiting for a CPU: time a busy shared machine took away (Linux; 0 elsewhere). */
  waited: number;
  /** Garbage-collection pauses: the test harness's heap, and on a busy machine its GC threads wait for a CPU too. */
  gc: number;
}

/** Main-thread CPU time and run-queue wait so far, in ms, or undefined where the kernel does not tell. */
function schedstat(): [ran: number, waited: number] | undefined {
  try {
    // "<ns on a CPU> <ns waiting on a run queue> <time slices>"
    const [ran, waited] = readFileSync('/proc/self/schedstat', 'utf8').split(' ').map(Number);
    return [ran / 1e6, waited / 1e6];
  } catch {
    return undefined;
  }
}

/**
 * Samples, every 5 ms, how long this process has run and waited for a CPU, and records its GC
 * pauses. On a busy shared machine the process is runnable but not running for a good part of the
 * time, and every answer in flight takes that much longer whatever the limiter does. `stop()` returns
 * `cpuBetween(from, to)`, from the samples inside that span only, so it never overstates.
 */
export function watchCpu(): { stop: () => (from: number, to: number) => CpuShare } {
  const samples: [at: number, ran: number, waited: number][] = [];
  const pauses: [start: number, end: number][] = [];
  const sample = () => {
    const stat = schedstat();
    if (stat !== undefined) samples.push([performance.now(), ...stat]);
  };
  const gc = new PerformanceObserver((list) => {
    for (const entry of list.getEntries()) pauses.push([entry.startTime, entry.startTime + entry.duration]);
  });
  gc.observe({ entryTypes: ['gc'] });
  sample();
  const ticker = setInterval(sample, 5);
  return {
    stop: () => {
      clearInterval(ticker);
      gc.disconnect();
      sample();
      return (from, to) => {
        const paused = pauses.reduce((sum, [a, b]) => sum + Math.max(0, Math.min(b, to) - Math.max(a, from)), 0);
        const inside = samples.filter(([at]) => at >= from && at <= to);
        if (inside.length < 2) return { ran: 0, waited: 0, gc: paused };
        const [first, last] = [inside[0], inside[inside.length - 1]];
        return { ran: last[1] - first[1], waited: last[2] - first[2], gc: paused };
      };
    },
  };
}
