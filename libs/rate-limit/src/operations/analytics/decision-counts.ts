import type { KeyedIdentity, SeriesPoint } from '../operations.types.js';
import { type SketchEntry, SpaceSaving } from './space-saving.js';

/** How far back counts handed back by `restore` are kept (seconds): the per-second series' retention. */
export const RESTORE_SECONDS = 3600;

/** Scopes counted at most by one instance: policies are finite, but a bug must not grow memory without end. */
export const DEFAULT_MAX_SCOPES = 1000;

/** What one scope (policy) counted since the last take. */
export interface ScopeCounts {
  scope: string;
  /** Exact decisions per epoch second, oldest first, only seconds with a decision. */
  seconds: SeriesPoint[];
  /** The top identities by allowed decisions (Space-Saving, K counters), highest first. */
  allowed: SketchEntry[];
  /** The top identities by refused decisions, highest first. */
  refused: SketchEntry[];
}

/** Counts handed over by `DecisionCounts.take()`, to be flushed in one call. */
export interface CountsSnapshot {
  scopes: ScopeCounts[];
}

/** One scope's counters; kept for the instance's life so that `record` finds it with one Map lookup. */
class ScopeTally {
  /** The epoch second being counted (-1: none yet). */
  second = -1;
  allowed = 0;
  refused = 0;
  /** Seconds finished since the last take (and those handed back by `restore`). */
  past: SeriesPoint[] = [];
  counted = false;
  readonly topAllowed: SpaceSaving;
  readonly topRefused: SpaceSaving;

  constructor(
    readonly scope: string,
    topK: number,
  ) {
    this.topAllowed = new SpaceSaving(topK);
    this.topRefused = new SpaceSaving(topK);
  }

  /** Closes the second being counted (kept in `past` when it saw a decision) and opens `second`. */
  roll(second: number): void {
    if (this.allowed + this.refused > 0) this.past.push({ at: this.second, allowed: this.allowed, refused: this.refused });
    this.second = second;
    this.allowed = 0;
    this.refused = 0;
  }
}

/**
 * Allowed and refused decisions per (scope, identity), counted in memory by one instance between two
 * flushes: exact totals per scope and epoch second, and the top K identities per scope by allowed and
 * by refused decisions (Space-Saving sketches, so memory does not grow with the number of identities).
 *
 * `record` is on the request path: one Map lookup, one clock read, O(1) sketch updates, no string
 * built. `take` hands over what was counted and starts afresh; `restore` adds a snapshot whose flush
 * failed back in, so that the next flush carries it.
 *
 * Memory is bounded by maxScopes × (2 K counters + the seconds since the last take), the seconds
 * restored being at most RESTORE_SECONDS per scope.
 */
export class DecisionCounts {
  private readonly scopes = new Map<string, ScopeTally>();
  private counted = false;
  private droppedCount = 0;

  /**
   * @param topK K of each sketch (the `operations.analytics.topK` option).
   * @param maxScopes scopes counted at most; decisions of further scopes are dropped (see `dropped`).
   * @param clock epoch milliseconds (tests pass a fake one).
   */
  constructor(
    readonly topK: number,
    readonly maxScopes = DEFAULT_MAX_SCOPES,
    private readonly clock: () => number = Date.now,
  ) {}

  /** Decisions not counted because their scope came after `maxScopes` others. */
  get dropped(): number {
    return this.droppedCount;
  }

  /** Counts one decision of `scope` for `id` (a refusal when `allowed` is false). */
  record(scope: string, id: KeyedIdentity, allowed: boolean): void {
    const tally = this.scopes.get(scope) ?? this.open(scope);
    if (tally === undefined) return;
    const second = Math.floor(this.clock() / 1000);
    if (second !== tally.second) tally.roll(second);
    if (allowed) {
      tally.allowed++;
      tally.topAllowed.add(id);
    } else {
      tally.refused++;
      tally.topRefused.add(id);
    }
    tally.counted = true;
    this.counted = true;
  }

  /** What was counted since the last take, and a fresh start; undefined when nothing was (an idle instance sends nothing). */
  take(): CountsSnapshot | undefined {
    if (!this.counted) return undefined;
    this.counted = false;
    const scopes: ScopeCounts[] = [];
    for (const tally of this.scopes.values()) {
      if (!tally.counted) continue;
      tally.counted = false;
      tally.roll(tally.second);
      scopes.push({
        scope: tally.scope,
        seconds: mergeSeconds(tally.past, Number.NEGATIVE_INFINITY),
        allowed: tally.topAllowed.entries(),
        refused: tally.topRefused.entries(),
      });
      tally.past = [];
      tally.topAllowed.clear();
      tally.topRefused.clear();
    }
    return { scopes };
  }

  /**
   * Adds back a snapshot whose flush failed, so that the next `take` carries it. Still bounded: seconds
   * older than RESTORE_SECONDS before `nowMs` are dropped, and the identities go through the same
   * K-counter sketches (each entry as its guaranteed count, `count - error`, so that counts stay lower
   * bounds).
   */
  restore(snapshot: CountsSnapshot, nowMs = this.clock()): void {
    const oldest = Math.floor(nowMs / 1000) - RESTORE_SECONDS;
    for (const counts of snapshot.scopes) {
      const tally = this.scopes.get(counts.scope) ?? this.open(counts.scope);
      if (tally === undefined) continue;
      tally.past = mergeSeconds(tally.past.concat(counts.seconds), oldest);
      for (const entry of counts.allowed) if (entry.count > entry.error) tally.topAllowed.add(entry.id, entry.count - entry.error);
      for (const entry of counts.refused) if (entry.count > entry.error) tally.topRefused.add(entry.id, entry.count - entry.error);
      tally.counted = true;
      this.counted = true;
    }
  }

  private open(scope: string): ScopeTally | undefined {
    if (this.scopes.size >= this.maxScopes) {
      this.droppedCount++;
      return undefined;
    }
    const tally = new ScopeTally(scope, this.topK);
    this.scopes.set(scope, tally);
    return tally;
  }
}

/** Seconds summed per epoch second, oldest first, from `oldest` on. */
function mergeSeconds(points: SeriesPoint[], oldest: number): SeriesPoint[] {
  const bySecond = new Map<number, SeriesPoint>();
  for (const point of points) {
    if (point.at < oldest) continue;
    const same = bySecond.get(point.at);
    if (same === undefined) bySecond.set(point.at, { ...point });
    else {
      same.allowed += point.allowed;
      same.refused += point.refused;
    }
  }
  return [...bySecond.values()].sort((a, b) => a.at - b.at);
}
