import { performance } from 'node:perf_hooks';
import type { INestApplication } from '@nestjs/common';
import { BucketService } from 'nest-redis-rate-limit';
import { type Answer, sleep, timedGet } from '../../support/load.js';
import { LOOP_LIMIT_MS, type LoopDelay } from '../../support/loop-delay.js';

export { LOOP_LIMIT_MS };

/**
 * README, "When Redis fails": "A decision never waits longer than `timeoutMs`" beyond the app's own
 * stall: a deadline is a timer, and a timer fires only when the event loop runs. How the failure-mode
 * tests hold the library to it:
 *
 * - Each decision is timed inside the app, from the call of `BucketService.decide()` to its verdict
 *   (`timeDecisions`), and must take at most `timeoutMs + SLACK_MS + the event-loop delay measured over
 *   the same span` (`LoopDelay.over`).
 * - Each limited request is sent together with a request to an unlimited control route of the same
 *   app; the limited answer may take at most `timeoutMs + SLACK_MS` longer than its control, plus the
 *   same loop delay. HTTP, the client and the app's other work cost both the same.
 * - A measure over that bound fails the test at once, whatever the others.
 * - A loop delay of up to `LOOP_LIMIT_MS` is what a quiet run shows; a measure that needed more than
 *   that taken off to meet its bound is "excused" by the load. A defect that lengthened every wait for
 *   the deadline (a doubled timer, a retry) could hide behind such delays, so a run is conclusive only
 *   if at least `PLAIN_WAITS` of the measures that waited out the deadline (at least `timeoutMs`; all of
 *   them when fewer) met the bound with at most `LOOP_LIMIT_MS` taken off: as on a quiet machine,
 *   and since `SLACK_MS + LOOP_LIMIT_MS < timeoutMs` (checked in `judge`), a wait of twice `timeoutMs`
 *   fails on them. A run without them is inconclusive and is tried again; after `ATTEMPTS`
 *   inconclusive runs the test fails.
 */
export const SLACK_MS = 40;
/** Measures that waited out the deadline on a quiet loop a run needs to be conclusive (see above). */
export const PLAIN_WAITS = 3;
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
  /** Measures over the bound even with their loop delay taken off: any one fails the test. */
  over: Measure[];
  /** Measures within the bound only with more than LOOP_LIMIT_MS of loop delay taken off. */
  excused: Measure[];
  /** Measures of at least timeoutMs (waits for the deadline), and how many of them met the bound with at most LOOP_LIMIT_MS taken off. */
  waits: number;
  plainWaits: number;
  /** At least PLAIN_WAITS of the waits (all, when fewer) were judged on a quiet loop. */
  conclusive: boolean;
  /** The largest measure, less its loop delay where that was needed to meet the bound. */
  worstMs: number;
}

const round = (ms: number) => Math.round(ms * 10) / 10;

function judge(label: string, boundMs: number, timeoutMs: number, measures: Measure[]): Judgement {
  if (SLACK_MS + LOOP_LIMIT_MS >= timeoutMs) {
    throw new Error(`timeoutMs ${timeoutMs} is too short to judge: SLACK_MS + LOOP_LIMIT_MS must be below it`);
  }
  const shown = (m: Measure) => ({ ...m, ms: round(m.ms), loopMs: round(m.loopMs) });
  const waits = measures.filter((m) => m.ms >= timeoutMs);
  // Within the bound with at most LOOP_LIMIT_MS taken off: as a quiet machine would have judged it.
  const plain = (m: Measure) => m.ms - Math.min(m.loopMs, LOOP_LIMIT_MS) <= boundMs;
  const plainWaits = waits.filter(plain).length;
  return {
    label,
    boundMs,
    count: measures.length,
    over: measures.filter((m) => m.ms - m.loopMs > boundMs).map(shown),
    excused: measures.filter((m) => !plain(m) && m.ms - m.loopMs <= boundMs).map(shown),
    waits: waits.length,
    plainWaits,
    conclusive: plainWaits >= Math.min(PLAIN_WAITS, waits.length),
    worstMs: round(Math.max(0, ...measures.map((m) => (m.ms <= boundMs ? m.ms : m.ms - m.loopMs)))),
  };
}

/**
 * Every decision that ended after `failedAt`: `decide()` to verdict within `timeoutMs + SLACK_MS` plus
 * the loop delay over its span.
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
 * Every limited request answered after `failedAt`: its latency minus its control's within
 * `timeoutMs + SLACK_MS` plus the loop delay over its span.
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

/** Fails the test on any measure over its bound; true when the judgements are conclusive. */
export function expectWithinBounds(judgements: readonly Judgement[]): boolean {
  expect(judgements.filter((j) => j.count === 0).map((j) => j.label)).toEqual([]);
  // Named, so that a failure says which bound and shows each measure over it, for every judgement at once.
  const over = Object.fromEntries(judgements.map((j) => [`${j.label}, over ${j.boundMs} ms plus its loop delay`, j.over]));
  expect(over).toEqual(Object.fromEntries(Object.keys(over).map((key) => [key, []])));
  return judgements.every((j) => j.conclusive);
}

const whyInconclusive = (j: Judgement) =>
  `${j.label}: ${j.plainWaits} of ${j.waits} waits for the deadline met ${j.boundMs} ms with at most ${LOOP_LIMIT_MS} ms taken off ` +
  `(${Math.min(PLAIN_WAITS, j.waits)} needed); ${j.excused.length} of ${j.count} measures met ${j.boundMs} ms only with more taken off, ` +
  `up to ${Math.max(0, ...j.excused.map((m) => m.loopMs))} ms`;

/**
 * A run of a scenario whose preconditions did not hold (not enough traffic reached the app, a wave
 * not inside Redis when it died...): it proves nothing either way, and is run again. Every assertion
 * the run could make must have been made before: an unmet precondition never hides a failure.
 */
export class Inconclusive extends Error {}

/** Throws `Inconclusive` naming each precondition (what was needed, what was seen) that did not hold. */
export function expectPreconditions(conditions: Record<string, { needed: string; seen: number | string; met: boolean }>): void {
  const unmet = Object.entries(conditions).filter(([, c]) => !c.met);
  if (unmet.length > 0) {
    throw new Inconclusive(unmet.map(([what, c]) => `${what}: ${c.seen} (${c.needed} needed)`).join('; '));
  }
}

/**
 * Runs `attempt` until its judgements are conclusive, at most ATTEMPTS times, with `between` after an
 * inconclusive run; each run's measures must be within their bounds. A run that throws `Inconclusive`
 * (a precondition of the scenario did not hold) is inconclusive too. Says so when a run is
 * inconclusive, and fails when none was conclusive.
 */
export async function untilConclusive(
  label: string,
  attempt: (n: number) => Promise<Judgement[]>,
  between: () => Promise<unknown> = async () => undefined,
): Promise<Judgement[]> {
  const reasons: string[] = [];
  for (let n = 0; n < ATTEMPTS; n++) {
    if (n > 0) await between();
    let reason: string;
    try {
      const judgements = await attempt(n);
      if (expectWithinBounds(judgements)) return judgements;
      reason = judgements
        .filter((j) => !j.conclusive)
        .map(whyInconclusive)
        .join('; ');
    } catch (error) {
      if (!(error instanceof Inconclusive)) throw error;
      reason = `precondition not met: ${error.message}`;
    }
    reasons.push(reason);
    process.stderr.write(`[inconclusive] ${label}, run ${n + 1} of ${ATTEMPTS}: ${reason}\n`);
  }
  throw new Error(`inconclusive: ${label}: the machine was too busy to judge in ${ATTEMPTS} runs (${reasons.join(' | ')})`);
}

/** Each wait (a span from a call to its answer) within `timeoutMs + SLACK_MS` plus the loop delay over it. */
export function judgeWaits(waits: readonly Span[], timeoutMs: number, loop: LoopDelay): Judgement {
  return judge(
    'wait',
    timeoutMs + SLACK_MS,
    timeoutMs,
    waits.map((w, i) => ({ what: `#${i}`, sentAt: 0, ms: w.endedAt - w.startedAt, loopMs: loop.over(w.startedAt, w.endedAt) })),
  );
}

/**
 * For a test without load (no HTTP): each wait within `timeoutMs + SLACK_MS` plus the loop delay over
 * it; fails the test as inconclusive when too few of the waits had a quiet loop (see above).
 */
export function expectWaitsBounded(waits: readonly Span[], timeoutMs: number, loop: LoopDelay): void {
  const j = judgeWaits(waits, timeoutMs, loop);
  if (!expectWithinBounds([j])) throw new Error(`inconclusive: ${whyInconclusive(j)}`);
}

/** Prints a figure when RL_TEST_FIGURES is set. */
export function timingFigure(label: string, judgements: readonly Judgement[], loop: LoopDelay): void {
  if (!process.env.RL_TEST_FIGURES) return;
  const parts = judgements.map(
    (j) =>
      `${j.label}: ${j.count} measures, worst ${j.worstMs} ms of ${j.boundMs}, ${j.excused.length} excused, ${j.plainWaits} of ${j.waits} waits on a quiet loop`,
  );
  process.stdout.write(`[figure] ${label}: ${parts.join('; ')}; worst loop window ${round(loop.worst())} ms\n`);
}
