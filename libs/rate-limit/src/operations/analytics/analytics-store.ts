import { randomUUID } from 'node:crypto';
import type { ChainableCommander, Cluster, Redis } from 'ioredis';
import type { SeriesPoint, TopIdentity } from '../operations.types.js';
import { opsKey, scopePart } from '../ops-keys.js';
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
import type { SketchEntry } from './space-saving.js';

/**
 * Analytics in Redis, every key under `<prefix>{ops}:a:` (one hash tag: one Cluster slot, so the tick's
 * pipeline goes to one node). The layout is AnalyticsBackend's; the keys, per scope `s` (scopePart):
 * - `a:s:<s>:<minute>` hash, fields `a<0-59>`, `r<0-59>`: allowed/refused per second of that minute;
 *   expires SERIES_KEEP_SECONDS after the minute ends;
 * - `a:m:<s>:<hour>` hash, fields `a<0-59>`, `r<0-59>`: per minute of that hour; expires
 *   retentionHours after the hour ends;
 * - `a:<tier><a|r>:<s>:<bucket>` sorted set, identity → count, trimmed to K: tiers `m` (minutes,
 *   expire 10 min after), `t` (10 minutes, 1 h after), `h` (hours, retentionHours after);
 * - `a:tmp:<id>` sorted sets that live within one flush or read, expiring in TEMP_SECONDS in case a
 *   connection drops between their creation and their DEL.
 * Every key is written with an absolute expiry (EXPIREAT) after each write, so every key expires by itself.
 *
 * Bytes, per scope, with K = topK, R = retentionHours, L = the longest identity (about 70 bytes: an
 * identity longer than 64 characters is keyed by its digest), m ≈ 60 bytes of a sorted set's overhead
 * per member (skiplist node and dict entry) and h ≈ 1.2 kB per hash of 120 small numbers:
 *   series   ≤ (SERIES_KEEP_SECONDS / 60 + 2) × h                      ≈ 75 kB
 *   totals   ≤ (R + 2) × h                                              ≈ 31 kB at R = 24
 *   tops     ≤ 2 × (12 + 8 + R + 2) × K × (L + m)                       ≈ 12 MB at K = 1,000, R = 24
 * and the total is that times the number of scopes, whatever the traffic and the number of identities.
 * The tops reach their bound only with more than K distinct identities per bucket (per minute, 10
 * minutes and hour); K = 100 divides it by 10.
 */

/** Seconds a temporary set of a flush or a read lives at most. */
export const TEMP_SECONDS = 60;

/** Up to this many identities of a kind are added one ZINCRBY each; more go through one ZADD and ZUNIONSTORE. */
const ZINCRBY_UP_TO = 16;

type Client = Redis | Cluster;

/** An identity's guaranteed count (count - error): what is flushed, so that stored counts are lower bounds. */
function guaranteed(entry: SketchEntry): number {
  return entry.count - entry.error;
}

/**
 * Appends the commands that write `snapshot` (counted up to `nowMs`) to `pipeline`, and answers how
 * many: the caller runs the pipeline (with its other {ops} commands: one round trip).
 */
export function appendFlush(
  pipeline: ChainableCommander,
  prefix: string,
  snapshot: CountsSnapshot,
  settings: AnalyticsSettings,
  nowMs: number,
  tempId: () => string = randomUUID,
): number {
  const before = pipeline.length;
  const nowSecond = Math.floor(nowMs / 1000);
  const retention = settings.retentionHours * 3600;
  for (const counts of snapshot.scopes) {
    const scope = scopePart(counts.scope);
    for (const [minute, points] of groupSeconds(counts, 60)) {
      const key = opsKey(prefix, 'a', 's', scope, String(minute));
      for (const point of points) {
        if (point.allowed > 0) pipeline.hincrby(key, `a${point.at % 60}`, point.allowed);
        if (point.refused > 0) pipeline.hincrby(key, `r${point.at % 60}`, point.refused);
      }
      pipeline.expireat(key, (minute + 1) * 60 + SERIES_KEEP_SECONDS);
    }
    const hours = new Set<number>();
    for (const [minute, sum] of minuteTotals(counts)) {
      const hour = Math.floor(minute / 60);
      const key = opsKey(prefix, 'a', 'm', scope, String(hour));
      if (sum.allowed > 0) pipeline.hincrby(key, `a${minute % 60}`, sum.allowed);
      if (sum.refused > 0) pipeline.hincrby(key, `r${minute % 60}`, sum.refused);
      hours.add(hour);
    }
    for (const hour of hours) pipeline.expireat(opsKey(prefix, 'a', 'm', scope, String(hour)), (hour + 1) * 3600 + retention);
    appendTops(pipeline, prefix, scope, 'a', counts.allowed, settings, nowSecond, tempId);
    appendTops(pipeline, prefix, scope, 'r', counts.refused, settings, nowSecond, tempId);
  }
  return pipeline.length - before;
}

/** Adds one kind's sketch entries to the current bucket of each tier, trims each to K and sets its expiry. */
function appendTops(
  pipeline: ChainableCommander,
  prefix: string,
  scope: string,
  kind: 'a' | 'r',
  entries: SketchEntry[],
  settings: AnalyticsSettings,
  nowSecond: number,
  tempId: () => string,
): void {
  // At most K of them: a bucket keeps K, and a flush stays bounded whatever snapshot it is given.
  const counted = entries.filter((entry) => guaranteed(entry) > 0);
  if (counted.length > settings.topK) counted.sort((a, b) => guaranteed(b) - guaranteed(a)).length = settings.topK;
  if (counted.length === 0) return;
  const keys = TOP_TIERS.map((tier) => {
    const bucket = Math.floor(nowSecond / tier.seconds);
    return {
      key: opsKey(prefix, 'a', tier.tag + kind, scope, String(bucket)),
      expireAt: (bucket + 1) * tier.seconds + tier.keepSeconds(settings),
    };
  });
  if (counted.length <= ZINCRBY_UP_TO) {
    for (const { key } of keys) for (const entry of counted) pipeline.zincrby(key, guaranteed(entry), entry.id);
  } else {
    const temp = opsKey(prefix, 'a', 'tmp', tempId());
    const members: (string | number)[] = [];
    for (const entry of counted) members.push(guaranteed(entry), entry.id);
    pipeline.zadd(temp, ...members);
    pipeline.expire(temp, TEMP_SECONDS);
    for (const { key } of keys) pipeline.zunionstore(key, 2, key, temp);
    pipeline.del(temp);
  }
  for (const { key, expireAt } of keys) {
    pipeline.zremrangebyrank(key, 0, -(settings.topK + 1));
    pipeline.expireat(key, expireAt);
  }
}

/** The replies of an exec, or the first error among them. */
function replies(results: [Error | null, unknown][] | null): unknown[] {
  if (results === null) throw new Error('Redis pipeline was discarded');
  return results.map(([error, value]) => {
    if (error) throw error;
    return value;
  });
}

/** A WITHSCORES reply as (member, score) pairs. */
function pairs(reply: unknown): [string, number][] {
  if (!Array.isArray(reply)) throw new TypeError(`expected an array of members and scores (got ${typeof reply})`);
  const out: [string, number][] = [];
  for (let i = 0; i + 1 < reply.length; i += 2) out.push([String(reply[i]), Number(reply[i + 1])]);
  return out;
}

/**
 * The top `limit` identities of `scope` by `by` over the last `windowSeconds` (AnalyticsBackend's
 * tiers), each with its allowed and refused counts over the same buckets. Two round trips: the union
 * of the window's buckets ranked, then the other kind's counts of the identities found.
 */
export async function readTop(redis: Client, prefix: string, scope: string, options: TopOptions, nowMs: number): Promise<TopIdentity[]> {
  const tier = tierFor(options.windowSeconds);
  const buckets = bucketsOverlapping(nowMs, options.windowSeconds, tier.seconds).map(String);
  const part = scopePart(scope);
  const [mine, other] = options.by === 'refused' ? (['r', 'a'] as const) : (['a', 'r'] as const);
  const keysOf = (kind: 'a' | 'r') => buckets.map((bucket) => opsKey(prefix, 'a', tier.tag + kind, part, bucket));
  const temp = opsKey(prefix, 'a', 'tmp', randomUUID());
  const ranked = replies(
    await redis
      .pipeline()
      .zunionstore(temp, buckets.length, ...keysOf(mine))
      .expire(temp, TEMP_SECONDS)
      .zrevrange(temp, 0, options.limit - 1, 'WITHSCORES')
      .del(temp)
      .exec(),
  );
  const top = pairs(ranked[2]);
  if (top.length === 0) return [];
  const ids = top.map(([id]) => id);
  const others = new Array<number>(ids.length).fill(0);
  const pipeline = redis.pipeline();
  for (const key of keysOf(other)) pipeline.zmscore(key, ...ids);
  for (const reply of replies(await pipeline.exec())) {
    if (!Array.isArray(reply)) throw new TypeError('expected ZMSCORE to answer an array');
    reply.forEach((score, i) => (others[i] += score === null ? 0 : Number(score)));
  }
  return top.map(([identity, count], i) =>
    options.by === 'refused' ? { identity, allowed: others[i], refused: count } : { identity, allowed: count, refused: others[i] },
  );
}

/** Allowed and refused per second of `scope` over the last `seconds` seconds ending at `nowMs`, oldest first, zeros included. One round trip. */
export async function readSeries(redis: Client, prefix: string, scope: string, seconds: number, nowMs: number): Promise<SeriesPoint[]> {
  const points = emptySeries(seconds, nowMs);
  if (points.length === 0) return points;
  const first = points[0].at;
  const minutes = bucketsOverlapping(nowMs, seconds, 60);
  const part = scopePart(scope);
  const pipeline = redis.pipeline();
  for (const minute of minutes) pipeline.hgetall(opsKey(prefix, 'a', 's', part, String(minute)));
  replies(await pipeline.exec()).forEach((reply, i) => {
    for (const [field, value] of Object.entries(reply as Record<string, string>)) {
      const point = points[minutes[i] * 60 + Number(field.slice(1)) - first];
      if (point === undefined) continue;
      if (field[0] === 'a') point.allowed = Number(value);
      else point.refused = Number(value);
    }
  });
  return points;
}

/** AnalyticsBackend over a Redis client (the store's), with the module's prefix and options. */
export class RedisAnalytics implements AnalyticsBackend {
  /** Names this instance's temporary keys: another instance's flush may interleave with ours. */
  private readonly instance = randomUUID().slice(0, 12);
  private flushes = 0;

  constructor(
    private readonly redis: Client,
    private readonly prefix: string,
    private readonly settings: AnalyticsSettings,
  ) {}

  flush(snapshot: CountsSnapshot, nowMs: number, pipeline?: ChainableCommander): number {
    if (pipeline === undefined) throw new TypeError('RedisAnalytics.flush needs the pipeline of the tick');
    return appendFlush(pipeline, this.prefix, snapshot, this.settings, nowMs, () => `${this.instance}.${this.flushes++}`);
  }

  top(scope: string, options: TopOptions, nowMs = Date.now()): Promise<TopIdentity[]> {
    return readTop(this.redis, this.prefix, scope, options, nowMs);
  }

  series(scope: string, seconds: number, nowMs = Date.now()): Promise<SeriesPoint[]> {
    return readSeries(this.redis, this.prefix, scope, seconds, nowMs);
  }
}
