import { performance } from 'node:perf_hooks';
import type { INestApplication } from '@nestjs/common';
import { BucketService } from 'nest-redis-rate-limit';
import { type Answer, sleep, timedGet } from '../../support/load.js';
import { LOOP_LIMIT_MS, type LoopDelay } from '../../support/loop-delay.js';

export { LOOP_LIMIT_MS };

/**
 * README, "When Redis fails": "A decision never waits longer than `timeoutMs`". How the failure-mode
 * tests hold the library to it:
 *
 * - Each decision is timed inside the app, from the call of `BucketService.decide()` to its verdict
 *   (`timeDecisions`), and must take at most `timeoutMs + SLACK_MS` once the event-loop delay over the
 *   same span is taken off (`LoopDelay.over`, at most `LOOP_LIMIT_MS` of it).
 * - Each limited request is sent together with a request to an unlimited control route of the same
 *   app; the limited answer may take at most `timeoutMs + SLACK_MS` longer than its control, with the
 *   same loop delay taken off. HTTP, the client and the app's other work cost both the same.
 * - A measure over its bound as measured, with a loop delay beyond `LOOP_LIMIT_MS`, cannot be judged:
 *   the machine, not the library, might explain that much. A run with any such measure is inconclusive
 *   and is tried again; after `ATTEMPTS` inconclusive runs the test fails. A measure that can be judged
 *   and is over its bound fails the test at once, whatever the others. (A measure within its bound as
 *   measured needs no loop delay taken off: it is judged, whatever the loop did.)
 *
 * Since SLACK_MS + LOOP_LIMIT_MS < timeoutMs (checked in `judge`), a decision that waited twice
 * `timeoutMs` can never be judged within its bound: it fails, or makes the run inconclusive.
 */
export const SLACK_MS = 40;
/** Runs tried before a test that could never judge fails. */
export const ATTEMPTS = 5;

/** One timed span: `startedAt`/`endedAt` are `performance.now()` ms. */
export interface Span {
  startedAt: number;
  endedAt: number;
}

/** A decision of the app, as `timeDecisions` saw it. */
export interface DecisionSpan extends Span {
  /** The verdict's source ('store', 'cache', 'open', 'closed', 'local'), or 'threw'. */
  source: string;
}

/**
 * Times every call of the app's `BucketService.decide()`, the one its guard decides through, from the
 * call to the verdict. The method itself runs unchanged (the wrapper only reads the clock around it);
 * `restore()` puts the class's method back.
 */
export function timeDecisions(app: INestApplication | { get: INestApplication['get'] }): {
  spans: DecisionSpan[];
  restore: () => void;
} {
  const buckets = app.get(BucketService);
  const original = BucketService.prototype.decide;
  const spans: DecisionSpan[] = [];
  buckets.decide = async function timedDecide(this: BucketService, ...args: Parameters<BucketService['decide']>) {
    const startedAt = performance.now();
    try {
      const verdict = await original.apply(buckets, args);
      spans.push({ startedAt, endedAt: performance.now(), source: verdict.source });
      return verdict;
    } catch (error) {
      spans.push({ startedAt, endedAt: performance.now(), source: 'threw' });
      throw error;
    }
  };
  return {
    spans,
    restore: () => {
      delete (buckets as Partial<BucketService>).decide;
    },
  };
}

/** A limited request and the control request sent at the same moment. */
export interface Pair {
  limited: Answer;
  control: Answer;
}

/** The unlimited route beside `/limited` (`ControlController`). */
export const controlUrlOf = (limitedUrl: string) => limitedUrl.replace(/\/limited(\/.*)?$/, '/control');

/** Sends a GET to `url` and one to the control route at the same time. */
export async function pairedGet(url: string, headers: Record<string, string>): Promise<Pair> {
  const [limited, control] = await Promise.all([timedGet(url, headers), timedGet(controlUrlOf(url), headers)]);
  return { limited, control };
}

/** `n` paired requests one after the other with one API key. */
export async function pairedBurst(url: string, apiKey: string, n: number): Promise<Pair[]> {
  const pairs: Pair[] = [];
  for (let i = 0; i < n; i++) pairs.push(await pairedGet(url, { 'x-api-key': apiKey }));
  return pairs;
}

/**
 * `startLoad`, each request paired with a control request: `workers` loops, each sending its next pair
 * once the last is answered and `thinkMs` passed, until `stop()`. `answers` are the limited ones.
 */
export function startPairedLoad(
  url: string,
  workers: number,
  { headers, thinkMs = 0, maxMs = 10_000 }: { headers: (n: number) => Record<string, string>; thinkMs?: number; maxMs?: number },
): { stop: () => void; done: Promise<Answer[]>; answers: Answer[]; pairs: Pair[] } {
  const pairs: Pair[] = [];
  const answers: Answer[] = [];
  let running = true;
  const deadline = performance.now() + maxMs;
  let sent = 0;
  const worker = async () => {
    while (running && performance.now() < deadline) {
      const pair = await pairedGet(url, headers(sent++));
      pairs.push(pair);
      answers.push(pair.limited);
      const pause = pair.limited.status === 0 ? Math.max(thinkMs, 10) : thinkMs;
      if (pause > 0) await sleep(pause);
    }
  };
  const stop = () => {
    running = false;
  };
  const done = Promise.all(Array.from({ length: workers }, worker)).then(() => answers);
  return { stop, done, answers, pairs };
}

/** One measure against its bound. */
interface Measure {
  what: string;
  /** When it began, relative to the failure (ms). */
  sentAt: number;
  ms: number;
  loopMs: number;
}

export interface Judgement {
  label: string;
  boundMs: number;
  count: number;
  /** Measures judged and over the bound: any one fails the test. */
  over: Measure[];
  /** Measures over the bound as measured, whose loop delay was beyond LOOP_LIMIT_MS. */
  unjudged: Measure[];
  /** The largest measure judged (less its loop delay where that was taken off). */
  worstMs: number;
}

const round = (ms: number) => Math.round(ms * 10) / 10;

function judge(label: string, boundMs: number, timeoutMs: number, measures: Measure[]): Judgement {
  if (SLACK_MS + LOOP_LIMIT_MS >= timeoutMs) {
    throw new Error(`timeoutMs ${timeoutMs} is too short to judge: SLACK_MS + LOOP_LIMIT_MS must be below it`);
  }
  // Within the bound as measured: nothing to take off. Over it: judged only if the loop delay that may
  // explain part of it is one the test can vouch for.
  const judged = measures.filter((m) => m.ms <= boundMs || m.loopMs <= LOOP_LIMIT_MS);
  const shown = (m: Measure) => ({ ...m, ms: round(m.ms), loopMs: round(m.loopMs) });
  return {
    label,
    boundMs,
    count: measures.length,
    over: judged.filter((m) => m.ms - m.loopMs > boundMs).map(shown),
    unjudged: measures.filter((m) => !judged.includes(m)).map(shown),
    worstMs: round(Math.max(0, ...judged.map((m) => (m.ms <= boundMs ? m.ms : m.ms - m.loopMs)))),
  };
}

/**
 * Every decision that ended after `failedAt`: `decide()` to verdict, less the loop delay over its
 * span, within `timeoutMs + SLACK_MS`.
 */
export function judgeDecisions(spans: readonly DecisionSpan[], failedAt: number, timeoutMs: number, loop: LoopDelay): Judgement {
  const touched = spans.filter((s) => s.endedAt >= failedAt);
  return judge(
    'decide() to verdict, in the app',
    timeoutMs + SLACK_MS,
    timeoutMs,
    touched.map((s) => ({
      what: s.source,
      sentAt: round(s.startedAt - failedAt),
      ms: s.endedAt - s.startedAt,
      loopMs: loop.over(s.startedAt, s.endedAt),
    })),
  );
}

/**
 * Every limited request answered after `failedAt`: its latency minus its control's, less the loop
 * delay over its span, within `timeoutMs + SLACK_MS`.
 */
export function judgePairs(pairs: readonly Pair[], failedAt: number, timeoutMs: number, loop: LoopDelay): Judgement {
  const touched = pairs.filter((p) => p.limited.endedAt >= failedAt);
  return judge(
    'limited answer minus its control, over HTTP',
    timeoutMs + SLACK_MS,
    timeoutMs,
    touched.map(({ limited, control }) => ({
      what: `${limited.status} (control ${round(control.endedAt - control.startedAt)} ms)`,
      sentAt: round(limited.startedAt - failedAt),
      ms: limited.endedAt - limited.startedAt - (control.endedAt - control.startedAt),
      loopMs: loop.over(limited.startedAt, limited.endedAt),
    })),
  );
}

/** Fails the test on any judged measure over its bound; true when every measure could be judged. */
export function expectWithinBounds(judgements: readonly Judgement[]): boolean {
  expect(judgements.filter((j) => j.count === 0).map((j) => j.label)).toEqual([]);
  // Named, so that a failure says which bound and shows each measure over it, for every judgement at once.
  const over = Object.fromEntries(judgements.map((j) => [`${j.label}, over ${j.boundMs} ms`, j.over]));
  expect(over).toEqual(Object.fromEntries(Object.keys(over).map((key) => [key, []])));
  return judgements.every((j) => j.unjudged.length === 0);
}

/**
 * Runs `attempt` until every measure it returns can be judged, at most ATTEMPTS times, with `between`
 * after an inconclusive run; each run's judged measures must be within their bounds. Says so when a
 * run is inconclusive, and fails when none was conclusive.
 */
export async function untilConclusive(
  label: string,
  attempt: (n: number) => Promise<Judgement[]>,
  between: () => Promise<unknown> = async () => undefined,
): Promise<Judgement[]> {
  const reasons: string[] = [];
  for (let n = 0; n < ATTEMPTS; n++) {
    if (n > 0) await between();
    const judgements = await attempt(n);
    if (expectWithinBounds(judgements)) return judgements;
    const reason = judgements
      .filter((j) => j.unjudged.length > 0)
      .map(
        (j) =>
          `${j.unjudged.length} of ${j.count} (${j.label}) took over ${j.boundMs} ms with a loop delay over ${LOOP_LIMIT_MS} ms, up to ${Math.max(...j.unjudged.map((m) => m.loopMs))} ms`,
      )
      .join('; ');
    reasons.push(reason);
    process.stderr.write(`[inconclusive] ${label}, run ${n + 1} of ${ATTEMPTS}: ${reason}\n`);
  }
  throw new Error(`inconclusive: ${label}: the machine was too busy to judge in ${ATTEMPTS} runs (${reasons.join(' | ')})`);
}

/**
 * For a test without load (no HTTP): each wait, less the loop delay over it, within
 * `timeoutMs + SLACK_MS`; a wait whose loop delay exceeds LOOP_LIMIT_MS fails the test as inconclusive.
 */
export function expectWaitsBounded(waits: readonly Span[], timeoutMs: number, loop: LoopDelay): void {
  const j = judge(
    'wait',
    timeoutMs + SLACK_MS,
    timeoutMs,
    waits.map((w, i) => ({ what: `#${i}`, sentAt: 0, ms: w.endedAt - w.startedAt, loopMs: loop.over(w.startedAt, w.endedAt) })),
  );
  expectWithinBounds([j]);
  if (j.unjudged.length > 0) {
    throw new Error(`inconclusive: loop delay over ${LOOP_LIMIT_MS} ms during ${JSON.stringify(j.unjudged)}`);
  }
}

/** Prints a figure when RL_TEST_FIGURES is set. */
export function timingFigure(label: string, judgements: readonly Judgement[], loop: LoopDelay): void {
  if (!process.env.RL_TEST_FIGURES) return;
  const parts = judgements.map((j) => `${j.label}: ${j.count} measures, worst ${j.worstMs} ms of ${j.boundMs}`);
  process.stdout.write(`[figure] ${label}: ${parts.join('; ')}; worst loop window ${round(loop.worst())} ms\n`);
}
