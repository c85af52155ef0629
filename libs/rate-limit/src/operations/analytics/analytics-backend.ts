import type { ChainableCommander } from 'ioredis';
import type { SeriesPoint, TopIdentity } from '../operations.types.js';
import type { CountsSnapshot, ScopeCounts } from './decision-counts.js';

/**
 * Where the counts of `DecisionCounts` go, and how they are read back: Redis (`RedisAnalytics`) or the
 * process (`MemoryAnalytics`, for store: 'memory'). Both keep the same layout and bounds, described
 * here once.
 *
 * Per scope (policy):
 * - the series: allowed and refused per epoch second, kept at least SERIES_KEEP_SECONDS (1 h) after
 *   the second, in one bucket per minute (120 small numbers: a compact Redis hash);
 * - totals per minute, kept `retentionHours` after the minute's hour, in one bucket per hour;
 * - the top identities by allowed and by refused decisions, each bucket trimmed to the top K, in three
 *   tiers (TOP_TIERS): per minute (kept 10 min, for windows up to 10 min), per 10 minutes (kept 1 h,
 *   for windows up to 1 h) and per hour (kept `retentionHours`, for longer windows). A flush adds the
 *   snapshot's tops to the current bucket of each tier.
 * A window is answered from the buckets of one tier that overlap it, so it is rounded out to whole
 * buckets: a 5-minute window reads 5 or 6 minutes, 1 h reads 60 to 70 minutes, 24 h reads 24 to 25 hours.
 *
 * Counts of the top lists are lower bounds: what an instance flushes for an identity is the part of its
 * sketch's count that is guaranteed (count - error), and a bucket trimmed to K forgets identities
 * below its K-th. With fewer than K identities in a bucket, the counts are exact.
 *
 * How to use it (the periodic tick of an instance):
 * ```ts
 * const snapshot = counts.take();                 // undefined: nothing counted, send nothing
 * if (snapshot) {
 *   const first = pipeline.length;                // Redis: the tick's one pipeline
 *   const n = backend.flush(snapshot, Date.now(), pipeline);
 *   const replies = await pipeline.exec();        // with the control read, one round trip
 *   if (!replies || failed(replies.slice(first, first + n))) counts.restore(snapshot);
 * }
 * ```
 * With MemoryAnalytics, `flush(snapshot, now)` applies the counts at once and answers 0.
 */
export interface AnalyticsBackend {
  /**
   * Writes a snapshot: Redis appends its commands to `pipeline` (required there; the caller runs it)
   * and answers how many it appended; memory applies it at once and answers 0.
   */
  flush(snapshot: CountsSnapshot, nowMs: number, pipeline?: ChainableCommander): number;
  /** The top `limit` identities of `scope` by `by` over the last `windowSeconds`, each with both counts. */
  top(scope: string, options: TopOptions, nowMs?: number): Promise<TopIdentity[]>;
  /** Allowed and refused per second of `scope` over the last `seconds` seconds (ending now), oldest first, zeros included. */
  series(scope: string, seconds: number, nowMs?: number): Promise<SeriesPoint[]>;
}

export interface TopOptions {
  by: 'refused' | 'allowed';
  /** 60 to 86,400 (longer than `retentionHours` reads what is kept). */
  windowSeconds: number;
  /** How many identities, highest first. */
  limit: number;
}

/** The analytics options as resolved (`operations.analytics`). */
export interface AnalyticsSettings {
  topK: number;
  retentionHours: number;
}

/** How long a second of the series is kept after it ends (the dashboard charts 15 minutes). */
export const SERIES_KEEP_SECONDS = 3600;

/** A tier of top-identity buckets: its key tag, its bucket length and how long a bucket is kept after it ends. */
export interface TopTier {
  tag: 'm' | 't' | 'h';
  seconds: number;
  keepSeconds(settings: AnalyticsSettings): number;
}

export const TOP_TIERS: readonly TopTier[] = [
  { tag: 'm', seconds: 60, keepSeconds: () => 600 },
  { tag: 't', seconds: 600, keepSeconds: () => 3600 },
  { tag: 'h', seconds: 3600, keepSeconds: (settings) => settings.retentionHours * 3600 },
];

/** The tier a window is read from: the finest whose buckets are kept as long as the window. */
export function tierFor(windowSeconds: number): TopTier {
  if (windowSeconds <= 600) return TOP_TIERS[0];
  if (windowSeconds <= 3600) return TOP_TIERS[1];
  return TOP_TIERS[2];
}

/** The buckets (numbers: epoch seconds / length) of `length` seconds that overlap the last `seconds` seconds, oldest first. */
export function bucketsOverlapping(nowMs: number, seconds: number, length: number): number[] {
  const nowSecond = Math.floor(nowMs / 1000);
  const out: number[] = [];
  for (let bucket = Math.floor((nowSecond - seconds + 1) / length); bucket <= Math.floor(nowSecond / length); bucket++) out.push(bucket);
  return out;
}

/** A snapshot's per-second points of one scope grouped by bucket of `length` seconds (the series: 60). */
export function groupSeconds(counts: ScopeCounts, length: number): Map<number, { at: number; allowed: number; refused: number }[]> {
  const groups = new Map<number, { at: number; allowed: number; refused: number }[]>();
  for (const point of counts.seconds) {
    const bucket = Math.floor(point.at / length);
    const group = groups.get(bucket);
    if (group === undefined) groups.set(bucket, [point]);
    else group.push(point);
  }
  return groups;
}

/** Per-minute sums of one scope's seconds, by epoch minute. */
export function minuteTotals(counts: ScopeCounts): Map<number, { allowed: number; refused: number }> {
  const minutes = new Map<number, { allowed: number; refused: number }>();
  for (const point of counts.seconds) {
    const minute = Math.floor(point.at / 60);
    const sum = minutes.get(minute);
    if (sum === undefined) minutes.set(minute, { allowed: point.allowed, refused: point.refused });
    else {
      sum.allowed += point.allowed;
      sum.refused += point.refused;
    }
  }
  return minutes;
}

/** The seconds of a series request, oldest first, all at zero. */
export function emptySeries(seconds: number, nowMs: number): SeriesPoint[] {
  const last = Math.floor(nowMs / 1000);
  return Array.from({ length: seconds }, (_, i) => ({ at: last - seconds + 1 + i, allowed: 0, refused: 0 }));
}
