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
 * Whether `figure` meets a goal `atLeast` / `atMost` `goal`, judged by its rounds: **met** when every
 * round meets it (the whole min–max spread lies on the goal's side), **missed** when every round misses
 * it, otherwise "within noise" (the rounds disagree, so the difference from the goal is not larger than
 * the spread). A figure measured once (or identical in every round: a byte count, a hard bound) has no
 * spread, so its one value decides.
 */
export function judge(figure: Spread, direction: 'atLeast' | 'atMost', goal: number): Verdict {
  if (!Number.isFinite(figure.median)) return 'missed';
  const worst = direction === 'atLeast' ? figure.min : figure.max;
  const best = direction === 'atLeast' ? figure.max : figure.min;
  const meets = (value: number) => (direction === 'atLeast' ? value >= goal : value <= goal);
  if (meets(worst)) return 'met';
  if (!meets(best)) return 'missed';
  return 'within noise';
}
