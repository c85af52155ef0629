import type { SeriesPoint, TopIdentity } from '../operations.types.js';
import {
  type AnalyticsBackend,
  type AnalyticsSettings,
  bucketsOverlapping,
  emptySeries,
  groupSeconds,
  minuteTotals,
  SERIES_KEEP_SECONDS,
  tierFor,
  TOP_TIERS,
  type TopOptions,
} from './analytics-backend.js';
import type { CountsSnapshot } from './decision-counts.js';

/** A bucket with the time it expires (epoch seconds), as a Redis key with EXPIREAT. */
interface Expiring<T> {
  value: T;
  expireAt: number;
}

/** One scope's buckets, keyed like the Redis ones (see RedisAnalytics): by minute, hour, or tier bucket. */
class ScopeStore {
  /** Epoch minute → allowed/refused per second of it (index 0-59). */
  readonly series = new Map<number, Expiring<{ allowed: number[]; refused: number[] }>>();
  /** Epoch hour → allowed/refused per minute of it. */
  readonly minutes = new Map<number, Expiring<{ allowed: number[]; refused: number[] }>>();
  /** `<tier tag><a|r>:<bucket>` → identity → count, at most K identities. */
  readonly tops = new Map<string, Expiring<Map<string, number>>>();
}

function sixty(): { allowed: number[]; refused: number[] } {
  return { allowed: new Array<number>(60).fill(0), refused: new Array<number>(60).fill(0) };
}

function slot<K, T>(map: Map<K, Expiring<T>>, key: K, expireAt: number, make: () => T): T {
  let entry = map.get(key);
  if (entry === undefined) map.set(key, (entry = { value: make(), expireAt }));
  return entry.value;
}

function live<K, T>(map: Map<K, Expiring<T>>, key: K, nowSecond: number): T | undefined {
  const entry = map.get(key);
  return entry !== undefined && entry.expireAt > nowSecond ? entry.value : undefined;
}

/** Forgets expired buckets (what Redis' expiry does by itself). */
function sweep<K, T>(map: Map<K, Expiring<T>>, nowSecond: number): void {
  for (const [key, entry] of map) if (entry.expireAt <= nowSecond) map.delete(key);
}

/** Keeps the `k` highest counts of `counts` (as ZREMRANGEBYRANK 0 -(K+1) does). */
function trim(counts: Map<string, number>, k: number): void {
  if (counts.size <= k) return;
  const sorted = [...counts].sort((a, b) => b[1] - a[1]);
  for (let i = k; i < sorted.length; i++) counts.delete(sorted[i][0]);
}

/**
 * AnalyticsBackend in the process, for store: 'memory' (one instance: its counts are the app's). The
 * same buckets, expiries and top-K trims as RedisAnalytics, so the same answers and bounds: per scope
 * at most 2 × (12 + 8 + R + 2) top buckets of K identities, (SERIES_KEEP_SECONDS / 60 + 2) series
 * buckets and (R + 2) minute-total buckets. Expired buckets are swept at each flush; a read skips them.
 * The number of scopes is bounded by DecisionCounts' maxScopes.
 */
export class MemoryAnalytics implements AnalyticsBackend {
  private readonly scopes = new Map<string, ScopeStore>();

  constructor(private readonly settings: AnalyticsSettings) {}

  flush(snapshot: CountsSnapshot, nowMs: number): number {
    const nowSecond = Math.floor(nowMs / 1000);
    const retention = this.settings.retentionHours * 3600;
    for (const store of this.scopes.values()) {
      sweep(store.series, nowSecond);
      sweep(store.minutes, nowSecond);
      sweep(store.tops, nowSecond);
    }
    for (const counts of snapshot.scopes) {
      let store = this.scopes.get(counts.scope);
      if (store === undefined) this.scopes.set(counts.scope, (store = new ScopeStore()));
      for (const [minute, points] of groupSeconds(counts, 60)) {
        const seconds = slot(store.series, minute, (minute + 1) * 60 + SERIES_KEEP_SECONDS, sixty);
        for (const point of points) {
          seconds.allowed[point.at % 60] += point.allowed;
          seconds.refused[point.at % 60] += point.refused;
        }
      }
      for (const [minute, sum] of minuteTotals(counts)) {
        const hour = Math.floor(minute / 60);
        const minutes = slot(store.minutes, hour, (hour + 1) * 3600 + retention, sixty);
        minutes.allowed[minute % 60] += sum.allowed;
        minutes.refused[minute % 60] += sum.refused;
      }
      for (const [kind, entries] of [
        ['a', counts.allowed],
        ['r', counts.refused],
      ] as const) {
        for (const tier of TOP_TIERS) {
          const bucket = Math.floor(nowSecond / tier.seconds);
          const expireAt = (bucket + 1) * tier.seconds + tier.keepSeconds(this.settings);
          let top: Map<string, number> | undefined;
          for (const entry of entries) {
            const count = entry.count - entry.error;
            if (count <= 0) continue;
            top ??= slot(store.tops, `${tier.tag}${kind}:${bucket}`, expireAt, () => new Map<string, number>());
            top.set(entry.id, (top.get(entry.id) ?? 0) + count);
          }
          if (top !== undefined) trim(top, this.settings.topK);
        }
      }
    }
    return 0;
  }

  top(scope: string, options: TopOptions, nowMs = Date.now()): Promise<TopIdentity[]> {
    const store = this.scopes.get(scope);
    if (store === undefined) return Promise.resolve([]);
    const nowSecond = Math.floor(nowMs / 1000);
    const tier = tierFor(options.windowSeconds);
    const sums = { a: new Map<string, number>(), r: new Map<string, number>() };
    for (const bucket of bucketsOverlapping(nowMs, options.windowSeconds, tier.seconds)) {
      for (const kind of ['a', 'r'] as const) {
        const top = live(store.tops, `${tier.tag}${kind}:${bucket}`, nowSecond);
        if (top !== undefined) for (const [id, count] of top) sums[kind].set(id, (sums[kind].get(id) ?? 0) + count);
      }
    }
    const mine = options.by === 'refused' ? sums.r : sums.a;
    const ranked = [...mine].sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? 1 : -1)).slice(0, options.limit);
    return Promise.resolve(
      ranked.map(([identity]) => ({ identity, allowed: sums.a.get(identity) ?? 0, refused: sums.r.get(identity) ?? 0 })),
    );
  }

  series(scope: string, seconds: number, nowMs = Date.now()): Promise<SeriesPoint[]> {
    const points = emptySeries(seconds, nowMs);
    const store = this.scopes.get(scope);
    if (store === undefined || points.length === 0) return Promise.resolve(points);
    const nowSecond = Math.floor(nowMs / 1000);
    for (const point of points) {
      const minute = live(store.series, Math.floor(point.at / 60), nowSecond);
      if (minute === undefined) continue;
      point.allowed = minute.allowed[point.at % 60];
      point.refused = minute.refused[point.at % 60];
    }
    return Promise.resolve(points);
  }

  /** Buckets held now (tests check the bound). */
  get bucketCount(): number {
    let n = 0;
    for (const store of this.scopes.values()) n += store.series.size + store.minutes.size + store.tops.size;
    return n;
  }
}
