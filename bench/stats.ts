/** The median of `values` (the mean of the middle two for an even count). */
export function median(values: readonly number[]): number {
  if (values.length === 0) return Number.NaN;
  const sorted = [...values].sort((a, b) => a - b);
  const mid = sorted.length >> 1;
  return sorted.length % 2 === 1 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
}

/** The `q` quantile (0..1) of `values`, nearest rank. */
export function quantile(values: ArrayLike<number>, q: number): number {
  if (values.length === 0) return Number.NaN;
  const sorted = Float64Array.from(values).sort();
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1))];
}

/** The most of `times` (ms, any order) that fall in any half-open window [t, t + windowMs). */
export function maxInWindow(times: readonly number[], windowMs: number): number {
  const sorted = [...times].sort((a, b) => a - b);
  let best = 0;
  let start = 0;
  for (let end = 0; end < sorted.length; end++) {
    while (sorted[end] - sorted[start] >= windowMs) start++;
    best = Math.max(best, end - start + 1);
  }
  return best;
}

/** `value` rounded to `digits` decimals, as a number (for JSON). */
export function round(value: number, digits = 0): number {
  const f = 10 ** digits;
  return Math.round(value * f) / f;
}

/** A figure measured once per round: the median and the per-round spread (min–max). */
export interface Spread {
  median: number;
  min: number;
  max: number;
  /** Rounds it was measured in. */
  n: number;
}

export function spreadOf(values: readonly number[], digits = 3): Spread {
  const finite = values.filter((v) => Number.isFinite(v));
  if (finite.length === 0) return { median: Number.NaN, min: Number.NaN, max: Number.NaN, n: 0 };
  return {
    median: round(median(finite), digits),
    min: round(Math.min(...finite), digits),
    max: round(Math.max(...finite), digits),
    n: finite.length,
  };
}

export type Verdict = 'met' | 'missed' | 'within noise';

/**
 * Whether `figure` meets a goal `atLeast` / `atMost` `goal`. The difference between the median and the
 * goal counts only when it is larger than the per-round spread (max − min): then the goal is met or
 * missed; otherwise the rounds cannot tell, and the answer is "within noise". A figure measured once
 * (or identical in every round: a byte count, a hard bound) has no spread, so any difference counts.
 */
export function judge(figure: Spread, direction: 'atLeast' | 'atMost', goal: number): Verdict {
  if (!Number.isFinite(figure.median)) return 'missed';
  const width = figure.max - figure.min;
  const margin = direction === 'atLeast' ? figure.median - goal : goal - figure.median;
  if (margin > width) return 'met';
  if (-margin > width) return 'missed';
  // No spread and exactly on the goal: the goal allows equality.
  if (width === 0 && margin === 0) return 'met';
  return 'within noise';
}
