import { randomUUID } from 'node:crypto';
import { jest } from '@jest/globals';
import { Redis } from 'ioredis';
import type { AnalyticsBackend } from '../../../libs/rate-limit/src/operations/analytics/analytics-backend.js';
import { RedisAnalytics } from '../../../libs/rate-limit/src/operations/analytics/analytics-store.js';
import { type CountsSnapshot, DecisionCounts } from '../../../libs/rate-limit/src/operations/analytics/decision-counts.js';
import { MemoryAnalytics } from '../../../libs/rate-limit/src/operations/analytics/memory-analytics.js';
import { hashTag } from '../../../libs/rate-limit/src/stores/redis/cluster-slots.js';
import { deleteKeys, keysUnder, redisUrl, testPrefix } from '../../support/redis.js';

const SETTINGS = { topK: 100, retentionHours: 2 };
const NOW = Math.floor(Date.now() / 60_000) * 60_000 + 30_000; // mid-minute: the seconds below stay in one minute
const SECOND = NOW / 1000;

let redis: Redis;
const prefixes: string[] = [];

beforeAll(async () => {
  redis = new Redis(await redisUrl());
});

afterAll(async () => {
  for (const prefix of prefixes) await deleteKeys(redis, prefix);
  redis.disconnect();
});

/** A backend of each kind, and how the tick would flush to it (Redis: one pipeline, executed, every reply checked). */
const BACKENDS: [string, () => { backend: AnalyticsBackend; flush: (snapshot: CountsSnapshot, nowMs: number) => Promise<void> }][] = [
  [
    'redis',
    () => {
      const prefix = testPrefix('analytics');
      prefixes.push(prefix);
      const backend = new RedisAnalytics(redis, prefix, SETTINGS);
      return {
        backend,
        flush: async (snapshot, nowMs) => {
          const pipeline = redis.pipeline();
          backend.flush(snapshot, nowMs, pipeline);
          for (const [error] of (await pipeline.exec()) ?? []) if (error) throw error;
        },
      };
    },
  ],
  [
    'memory',
    () => {
      const backend = new MemoryAnalytics(SETTINGS);
      return { backend, flush: async (snapshot, nowMs) => void backend.flush(snapshot, nowMs) };
    },
  ],
];

/** Decisions recorded at `atMs`, taken as one snapshot. */
function snapshotOf(atMs: number, decisions: [scope: string, id: string, allowed: boolean, times: number][]): CountsSnapshot {
  const counts = new DecisionCounts(SETTINGS.topK, 100, () => atMs);
  for (const [scope, id, allowed, times] of decisions) for (let i = 0; i < times; i++) counts.record(scope, id, allowed);
  const snapshot = counts.take();
  if (snapshot === undefined) throw new Error('nothing counted');
  return snapshot;
}

describe.each(BACKENDS)('analytics in %s: what was flushed is read back exactly', (_kind, make) => {
  it('gives the per-second series (zeros included, oldest first) and the top identities with both counts', async () => {
    const { backend, flush } = make();
    await flush(
      snapshotOf(NOW - 2000, [
        ['login', 'ip:10.0.0.1', false, 7],
        ['login', 'ip:10.0.0.2', true, 3],
      ]),
      NOW - 2000,
    );
    await flush(
      snapshotOf(NOW, [
        ['login', 'ip:10.0.0.1', true, 2],
        ['login', 'ip:10.0.0.2', false, 4],
        ['login', 'user:42', false, 1],
      ]),
      NOW,
    );
    await flush(snapshotOf(NOW, [['GET /other path', 'user:42', false, 9]]), NOW);

    expect(await backend.series('login', 4, NOW)).toEqual([
      { at: SECOND - 3, allowed: 0, refused: 0 },
      { at: SECOND - 2, allowed: 3, refused: 7 },
      { at: SECOND - 1, allowed: 0, refused: 0 },
      { at: SECOND, allowed: 2, refused: 5 },
    ]);
    expect(await backend.series('login', 900, NOW)).toHaveLength(900);
    expect(await backend.top('login', { by: 'refused', windowSeconds: 300, limit: 10 }, NOW)).toEqual([
      { identity: 'ip:10.0.0.1', allowed: 2, refused: 7 },
      { identity: 'ip:10.0.0.2', allowed: 3, refused: 4 },
      { identity: 'user:42', allowed: 0, refused: 1 },
    ]);
    expect(await backend.top('login', { by: 'allowed', windowSeconds: 300, limit: 1 }, NOW)).toEqual([
      { identity: 'ip:10.0.0.2', allowed: 3, refused: 4 },
    ]);
    // A scope that is not a plain key part (kept under its digest) is read back under its own name.
    expect(await backend.top('GET /other path', { by: 'refused', windowSeconds: 3600, limit: 10 }, NOW)).toEqual([
      { identity: 'user:42', allowed: 0, refused: 9 },
    ]);
    expect(await backend.top('nothing', { by: 'refused', windowSeconds: 300, limit: 10 }, NOW)).toEqual([]);
  });

  it('answers 5 min, 1 h and 24 h windows from what was flushed within them, and nothing older than retentionHours (2)', async () => {
    const { backend, flush } = make();
    await flush(snapshotOf(NOW - 5 * 3600_000, [['api', 'key:expired', false, 9]]), NOW - 5 * 3600_000);
    await flush(snapshotOf(NOW - 90 * 60_000, [['api', 'key:old', false, 5]]), NOW - 90 * 60_000);
    await flush(snapshotOf(NOW - 30 * 60_000, [['api', 'key:recent', false, 3]]), NOW - 30 * 60_000);
    await flush(snapshotOf(NOW, [['api', 'key:now', false, 1]]), NOW);
    const ids = async (windowSeconds: number) =>
      (await backend.top('api', { by: 'refused', windowSeconds, limit: 10 }, NOW)).map((t) => t.identity);
    expect(await ids(300)).toEqual(['key:now']);
    expect(await ids(3600)).toEqual(['key:recent', 'key:now']);
    expect(await ids(86_400)).toEqual(['key:old', 'key:recent', 'key:now']);
  });
});

describe('analytics in redis: bounded, expiring, one round trip', () => {
  const prefix = testPrefix('analytics-bounds');
  prefixes.push(prefix);
  const backend = new RedisAnalytics({} as Redis, prefix, SETTINGS);

  async function flushed(snapshot: CountsSnapshot, nowMs = NOW): Promise<number> {
    const pipeline = redis.pipeline();
    const n = backend.flush(snapshot, nowMs, pipeline);
    for (const [error] of (await pipeline.exec()) ?? []) if (error) throw error;
    return n;
  }

  beforeAll(async () => {
    // 100,000 distinct identities: 10 flushes of 10,000 through the sketch (ZADD and ZUNIONSTORE), 20 flushes
    // of 10 new ones each (ZINCRBY), and one snapshot of 100,000 entries as is.
    for (let f = 0; f < 10; f++) {
      const counts = new DecisionCounts(SETTINGS.topK, 100, () => NOW);
      for (let i = 0; i < 10_000; i++) counts.record('flood', `ip:10.${f}.${i >> 8}.${i & 255}`, i % 2 === 0);
      await flushed(counts.take() as CountsSnapshot);
    }
    for (let f = 0; f < 20; f++) {
      await flushed(
        snapshotOf(
          NOW,
          Array.from({ length: 10 }, (_, i) => ['trickle', `user:${f}-${i}`, false, 1 + i] as const).map((d) => [...d]),
        ),
      );
    }
    const entries = Array.from({ length: 100_000 }, (_, i) => ({ id: `key:${randomUUID()}`, count: 1 + (i % 50), error: 0 }));
    await flushed({ scopes: [{ scope: 'raw', seconds: [{ at: SECOND, allowed: 1, refused: 1 }], allowed: entries, refused: entries }] });
  });

  it('keeps every sorted set to K members and the bytes within the bound after 100,000 distinct identities', async () => {
    const keys = await keysUnder(redis, prefix);
    let bytes = 0;
    let sets = 0;
    for (const key of keys) {
      bytes += Number(await redis.memory('USAGE', key, 'SAMPLES', '0'));
      if ((await redis.type(key)) === 'zset') {
        sets++;
        expect(await redis.zcard(key)).toBeLessThanOrEqual(SETTINGS.topK);
      }
    }
    // 3 tiers × (allowed and refused in 'flood' and 'raw', refused only in 'trickle'); none left over from a
    // flush (its temporary sets are deleted).
    expect(sets).toBe(15);
    expect(keys.filter((key) => key.includes(':a:tmp:'))).toEqual([]);
    // The bound of analytics-store.ts at this moment: per scope ≤ 2 series + 1 totals hashes (≤ 2 kB each) and
    // 6 sets of K members of ≤ 70 + 60 bytes (key:<uuid> is 40 characters).
    const bound = 3 * (3 * 2048 + 6 * SETTINGS.topK * 130);
    process.stdout.write(`analytics bytes after 100,000 identities: ${bytes} in ${keys.length} keys (bound ${bound})\n`);
    expect(bytes).toBeLessThanOrEqual(bound);
  });

  it('gives every key an expiry of at most the retention after its bucket (the hour) ends', async () => {
    const keys = await keysUnder(redis, prefix);
    expect(keys.length).toBeGreaterThan(0);
    for (const key of keys) {
      const ttl = await redis.ttl(key);
      expect([key, ttl > 0]).toEqual([key, true]);
      expect(ttl).toBeLessThanOrEqual(SETTINGS.retentionHours * 3600 + 3600);
    }
  });

  it('is one pipeline: one write to the socket, the commands MONITOR sees are the ones appended, all in the {ops} slot', async () => {
    const probe = new Redis(await redisUrl());
    const watcher = new Redis(await redisUrl());
    const monitor = await watcher.monitor();
    try {
      const address = /addr=(\S+)/.exec(String(await probe.client('INFO')))![1];
      const seen: string[][] = [];
      monitor.on('monitor', (_time: string, args: unknown[], source: string) => source === address && seen.push(args.map(String)));
      const marker = `mark-${randomUUID()}`;
      const counts = new DecisionCounts(SETTINGS.topK, 100, () => NOW);
      for (let i = 0; i < 40; i++) counts.record(i % 2 ? 'login' : 'search', `ip:192.0.2.${i}`, i % 3 !== 0);
      const pipeline = probe.pipeline();
      const appended = backend.flush(counts.take() as CountsSnapshot, NOW, pipeline);
      const write = jest.spyOn(probe.stream, 'write');
      const replies = await pipeline.exec();
      expect(write).toHaveBeenCalledTimes(1);
      write.mockRestore();
      expect(replies?.every(([error]) => error === null)).toBe(true);
      await probe.echo(marker);
      const deadline = Date.now() + 5000;
      while (!seen.some((args) => args[1] === marker) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 5));
      const commands = seen.filter((args) => args[1] !== marker);
      expect(appended).toBeGreaterThan(0);
      expect(commands).toHaveLength(appended);
      expect(new Set(commands.map((args) => hashTag(args[1])))).toEqual(new Set(['ops']));
    } finally {
      monitor.disconnect();
      watcher.disconnect();
      probe.disconnect();
    }
  });
});

describe('analytics in memory: bounded like Redis', () => {
  it('keeps K identities per bucket and the same buckets after 100,000 distinct identities', () => {
    const memory = new MemoryAnalytics(SETTINGS);
    for (let f = 0; f < 10; f++) {
      const counts = new DecisionCounts(SETTINGS.topK, 100, () => NOW);
      for (let i = 0; i < 10_000; i++) counts.record('flood', `ip:10.${f}.${i >> 8}.${i & 255}`, i % 2 === 0);
      memory.flush(counts.take() as CountsSnapshot, NOW);
    }
    // 1 series minute, 1 totals hour, 3 tiers × allowed/refused.
    expect(memory.bucketCount).toBe(8);
    return Promise.all(
      [60, 3600, 86_400].map(async (windowSeconds) => {
        expect(await memory.top('flood', { by: 'allowed', windowSeconds, limit: 10_000 }, NOW)).toHaveLength(SETTINGS.topK);
        expect(await memory.top('flood', { by: 'refused', windowSeconds, limit: 10_000 }, NOW)).toHaveLength(SETTINGS.topK);
      }),
    );
  });
});
