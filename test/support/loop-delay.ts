import { monitorEventLoopDelay, performance } from 'node:perf_hooks';

/**
 * Loop delay a quiet run stays within: 50 ms is what a busy 2-core machine with the 16 load loops of
 * these tests shows now and then (a GC, another process's burst). A measure that needs more of it
 * taken off to meet its bound is excused by the load, and does not count towards a conclusive run
 * (test/redis/failure-modes/timing.ts).
 */
export const LOOP_LIMIT_MS = 50;

/**
 * How late this process's event loop ran, over time, from `perf_hooks.monitorEventLoopDelay`.
 *
 * The histogram ticks every `resolutionMs` and records the interval between its ticks; a tick that
 * came late records the lateness too. The histogram is never reset (a reset drops the next interval,
 * so a stall right after it would go unseen). Instead a sampler reads its running count and sum every
 * `windowMs`: a window's lateness is (sum of intervals recorded in it) − (their count × resolution),
 * i.e. how long the loop stood still beyond its ticks, at least as large as the longest stall the
 * window saw. The histogram records nothing for the interval before its first tick (Node only sets
 * its starting point then), so a stall that began as the watch started went unseen: beside 4 CPU-bound
 * processes, two decisions took 242 ms against a deadline of 150 ms with 21 ms of loop delay measured,
 * the loop held for ~70 ms between the first decision's write and the others' (which wait for the end of
 * the turn and start their deadline then). Until the histogram holds an interval, a window's lateness is
 * the sampler's own: how late its timer came.
 *
 * `over(from, to)` is the loop delay a task that ran from `from` to `to` may have suffered: the sum of
 * the lateness of the windows overlapping the span, and of the one window after them. A stall is
 * recorded by the first tick after it, which runs in the same timers phase as the first sample after
 * it, before or after that sample: so in the window that sample ends, or in the next. That next window
 * begins when that sample ran, which can be long after `to` when the loop stays busy after the task
 * (a deadline that expired 29 decisions at once, all of them answered in the same check phase): a
 * fixed margin after `to` (10 ms, before) missed it, and a run beside 10 CPU-bound processes showed a
 * decision of 416 ms, late 316 ms on the loop, measured with 234 ms. All of them: on a 2-core machine the process is also descheduled in slices
 * (another process's burst), which makes its timers late a few ms in many windows rather than once;
 * counting only the largest windows took 61 ms of a 161 ms decision for the library's own (a CI run).
 * A task parked while the loop is busy with other work could have that work taken off its wait: the
 * judge (test/redis/failure-modes/timing.ts) takes all of it off, but concludes only when enough waits
 * needed at most `LOOP_LIMIT_MS` of it, and `SLACK_MS + LOOP_LIMIT_MS < timeoutMs`, so a defect that
 * doubles every wait still fails.
 */
export interface LoopDelay {
  /** The loop delay (ms) a task that ran from `from` to `to` (`performance.now()`) may have suffered. */
  over(from: number, to: number): number;
  /** The largest window lateness seen so far (ms). */
  worst(): number;
  stop(): void;
}

export function watchLoopDelay({ resolutionMs = 5, windowMs = 10 } = {}): LoopDelay {
  const histogram = monitorEventLoopDelay({ resolution: resolutionMs });
  histogram.enable();
  // [end of the window, lateness in it (ms)], in order; the window starts at the previous end.
  const windows: [at: number, lateMs: number][] = [];
  let last = { at: performance.now(), count: 0, sumNs: 0 };
  const sample = (byTimer: boolean) => {
    const count = histogram.count;
    // `mean` is NaN while nothing is recorded.
    const sumNs = count === 0 ? 0 : histogram.mean * count;
    const at = performance.now();
    const intervals = count - last.count;
    let lateMs = Math.max(0, (sumNs - last.sumNs) / 1e6 - intervals * resolutionMs);
    // No interval recorded yet: a stall since the start is not in the histogram (see above), but the
    // sampler's own timer, due `windowMs` after the previous sample, was late by it.
    if (count === 0 && byTimer) lateMs = Math.max(0, at - last.at - windowMs);
    windows.push([at, lateMs]);
    last = { at, count, sumNs };
  };
  const sampler = setInterval(() => sample(true), windowMs);
  const startedAt = last.at;
  let stopped = false;
  return {
    over(from, to) {
      if (!stopped) sample(false);
      if (from < startedAt) throw new Error('loop delay asked for a span that began before it was watched');
      let late = 0;
      for (let i = 0; i < windows.length; i++) {
        const begins = i === 0 ? startedAt : windows[i - 1][0];
        const [ends, lateMs] = windows[i];
        if (ends < from) continue;
        late += lateMs;
        // The window that begins after `to` is the last one counted (see above).
        if (begins > to) break;
      }
      return late;
    },
    worst: () => Math.max(0, ...windows.map(([, lateMs]) => lateMs)),
    stop() {
      if (stopped) return;
      sample(false);
      stopped = true;
      clearInterval(sampler);
      histogram.disable();
    },
  };
}
