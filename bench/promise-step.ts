import type { PromiseReply } from './promise-worker.js';
import { limiterPrefix } from './limiters.js';
import { forkWorker, nextMessage, progress } from './processes.js';
import type { BenchResults, BoundCheck, PromiseResult } from './results.js';
import { LIMITS, PROBE_LENGTH_MS, PROBE_OPEN_MS, PROMISE_LIMITERS, type PromiseLimiter, SETTINGS, STATED_PER_SECOND } from './settings.js';
import { maxInWindow, round } from './stats.js';

/**
 * The promise step: several processes saturate one key, then a boundary probe (see promise-worker.ts).
 * Each limiter is judged by what its own documentation promises (its bounds below), and separately
 * the run shows what a user who reads "100 per second" gets: the most allowed in any sliding second.
 */

/** A limiter's documented promise, as the most it may allow in a span of time. */
export interface PromiseBounds {
  semantics: PromiseResult['semantics'];
  promise: string;
  /** The most it may allow in `ms` from the first request on a fresh key. */
  fromFresh(ms: number): number;
  /** The most it may allow in any span of `ms` (sliding, not aligned to anything). */
  inAnySpan(ms: number): number;
}

const { capacity, refillPerSecond, limit, windowMs } = LIMITS.promise;

/** Token bucket (ours): at most capacity + refill·t in any t, from a full bucket or not. */
const tokenBucket: PromiseBounds = {
  semantics: 'token bucket',
  promise: `token bucket: ${refillPerSecond}/s, burst ${capacity} (at most ${capacity} + ${refillPerSecond}·t in any t seconds)`,
  fromFresh: (ms) => Math.floor(capacity + (refillPerSecond * ms) / 1000),
  inAnySpan: (ms) => Math.floor(capacity + (refillPerSecond * ms) / 1000),
};

/**
 * Fixed window (rate-limiter-flexible, @nestjs/throttler): at most `limit` per window, a window opened
 * by the first request after the last one ended. From a fresh key, t ms meet floor(t/w) + 1 windows;
 * any sliding span of t ms meets at most ceil(t/w) + 1 of them (two for t <= w: the window boundary).
 */
const fixedWindow: PromiseBounds = {
  semantics: 'fixed window',
  promise: `fixed window: ${limit} per ${windowMs / 1000} s window, windows start at the first request`,
  fromFresh: (ms) => limit * (Math.floor(ms / windowMs) + 1),
  inAnySpan: (ms) => limit * (Math.ceil(ms / windowMs) + 1),
};

export const PROMISE_BOUNDS: Record<PromiseLimiter, PromiseBounds> = {
  ours: tokenBucket,
  'rate-limiter-flexible': fixedWindow,
  'nestjs-throttler': fixedWindow,
};

/** The allowed-reply times of one limiter's run, as the promise builder needs them. */
export interface PromiseSamples {
  seconds: number;
  saturated: number[];
  boundary: number[];
  denied: number;
  errors: number;
}

/** One summary for every kind of promise: the bounds say what the limiter may do. */
export function summarizePromise(samples: PromiseSamples, bounds: PromiseBounds): PromiseResult {
  const check = (what: string, measured: number, bound: number): BoundCheck => ({ what, measured, bound, ok: measured <= bound });
  const saturatedMaxIn1s = maxInWindow(samples.saturated, 1000);
  const boundaryMaxIn1s = maxInWindow(samples.boundary, 1000);
  const boundaryMaxIn200ms = maxInWindow(samples.boundary, 200);
  const checks = [
    check(`allowed in ${samples.seconds.toFixed(2)} s, saturated`, samples.saturated.length, bounds.fromFresh(samples.seconds * 1000)),
    check('most in any 1 s, saturated', saturatedMaxIn1s, bounds.inAnySpan(1000)),
    check('most in any 1 s across a window boundary', boundaryMaxIn1s, bounds.inAnySpan(1000)),
    check('most in any 200 ms across a window boundary', boundaryMaxIn200ms, bounds.inAnySpan(200)),
  ];
  return {
    semantics: bounds.semantics,
    promise: bounds.promise,
    saturation: { seconds: round(samples.seconds, 3), allowed: samples.saturated.length, denied: samples.denied, errors: samples.errors },
    own: { checks, kept: checks.every((c) => c.ok) },
    reader: { statedPerSecond: STATED_PER_SECOND, saturatedMaxIn1s, boundaryMaxIn1s, boundaryMaxIn200ms },
  };
}

export function promisePlannedSeconds(): number {
  return PROMISE_LIMITERS.length * (SETTINGS.promiseSeconds + (PROBE_OPEN_MS + PROBE_LENGTH_MS) / 1000 + 2);
}

export async function promiseStep(runPrefix: string): Promise<BenchResults['promise']> {
  const out: BenchResults['promise'] = {};
  for (const name of PROMISE_LIMITERS) {
    const t = Date.now();
    const prefix = limiterPrefix(`${runPrefix}promise:`, name);
    const workers = Array.from({ length: SETTINGS.promiseProcesses }, (_, i) =>
      forkWorker('promise-worker.js', [
        name,
        prefix,
        'one-key',
        String(i),
        String(SETTINGS.promiseInFlight),
        String(SETTINGS.promiseSeconds),
      ]),
    );
    await Promise.all(workers.map((w) => nextMessage(w, `${name} promise worker ready`)));
    const replies = workers.map((w) => nextMessage<PromiseReply>(w, `${name} promise result`, 60_000));
    const goAt = Date.now() + 300;
    const probeAt = goAt + SETTINGS.promiseSeconds * 1000 + 800;
    for (const w of workers) w.send({ goAt, probeAt });
    const results = await Promise.all(replies);

    const firstSent = Math.min(...results.map((r) => r.saturation.firstSentAt));
    const lastReply = Math.max(...results.map((r) => r.saturation.lastReplyAt));
    const result = summarizePromise(
      {
        seconds: (lastReply - firstSent) / 1000,
        saturated: results.flatMap((r) => r.saturation.allowed),
        boundary: results.flatMap((r) => r.boundary.allowed),
        denied: results.reduce((n, r) => n + r.saturation.denied, 0),
        errors: results.reduce((n, r) => n + r.saturation.errors + r.boundary.errors, 0),
      },
      PROMISE_BOUNDS[name],
    );
    out[name] = result;
    progress(
      'promise',
      `${name} (${result.semantics}): ${result.own.checks.map((c) => `${c.what} ${c.measured} (bound ${c.bound})`).join('; ')} → ` +
        `${result.own.kept ? 'kept' : 'NOT kept'}; a reader of "${STATED_PER_SECOND}/s" sees up to ${Math.max(result.reader.saturatedMaxIn1s, result.reader.boundaryMaxIn1s)} in 1 s`,
      Date.now() - t,
      SETTINGS.promiseSeconds + (PROBE_OPEN_MS + PROBE_LENGTH_MS) / 1000 + 2,
    );
  }
  return out;
}
