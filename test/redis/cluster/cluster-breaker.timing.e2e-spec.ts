import { Test, type TestingModule } from '@nestjs/testing';
import { type Cluster, Redis } from 'ioredis';
import { BucketService, RateLimitModule, RateLimitUnavailableError } from 'nest-redis-rate-limit';
import { keySlot } from '../../../libs/rate-limit/src/stores/redis/cluster-slots.js';
import { LocalCluster } from '../../support/cluster.js';
import { hasRedisServerBinary, testPrefix } from '../../support/redis.js';

/**
 * Issue 10, item 6: one breaker per Redis node. With one failure counter for the whole Cluster, every
 * success on a healthy shard reset it, so a hung shard never tripped the breaker and every request
 * hashed to it waited `timeoutMs`. Now the hung master's breaker opens after 3 failures in a row: one
 * decision at a time probes it, the others are answered by `failureMode` at once, while the healthy
 * masters keep deciding every request.
 */
const TIMEOUT_MS = 150;
const policy = { capacity: 1_000_000, refillPerSecond: 1 };

describe('a Redis Cluster with one master frozen (SIGSTOP)', () => {
  const prefix = testPrefix('cluster-breaker');
  let cluster: LocalCluster;
  let masters: Redis[];
  let client: Cluster;
  let moduleRef: TestingModule;
  let buckets: BucketService;
  /** Bucket names whose keys live on master 0, 1 and 2. */
  const names: string[][] = [[], [], []];

  beforeAll(async () => {
    if (!hasRedisServerBinary()) throw new Error('the Redis Cluster tests need the redis-server binary on PATH');
    cluster = await LocalCluster.start(3);
    masters = cluster.nodes.map((n) => new Redis({ host: n.host, port: n.port }));
    const ranges = (await masters[0].call('CLUSTER', 'SLOTS')) as [number, number, [string, number]][];
    const ownerOf = (slot: number) => {
      const [, , [, port]] = ranges.find(([first, last]) => slot >= first && slot <= last)!;
      return cluster.nodes.findIndex((n) => n.port === Number(port));
    };
    for (let i = 0; names.some((list) => list.length < 12); i++) {
      const name = `b${i}`;
      const owner = ownerOf(Number(await masters[0].call('CLUSTER', 'KEYSLOT', `${prefix}{${name}}`)));
      if (names[owner].length < 12) names[owner].push(name);
    }
    client = await cluster.client();
    moduleRef = await Test.createTestingModule({
      imports: [
        RateLimitModule.forRoot({ redis: client, keyPrefix: prefix, timeoutMs: TIMEOUT_MS, failureMode: 'closed', denyCache: false }),
      ],
    }).compile();
    await moduleRef.init();
    buckets = moduleRef.get(BucketService);
  }, 60_000);

  afterAll(async () => {
    await moduleRef?.close();
    client?.disconnect();
    masters?.forEach((m) => m.disconnect());
    await cluster?.stop();
  });

  /** How long one consume takes, and whether the store decided it (failureMode 'closed' throws otherwise). */
  async function timed(name: string): Promise<{ ms: number; decided: boolean }> {
    const started = performance.now();
    try {
      await buckets.consume(name, policy);
      return { ms: performance.now() - started, decided: true };
    } catch (error) {
      if (!(error instanceof RateLimitUnavailableError)) throw error;
      return { ms: performance.now() - started, decided: false };
    }
  }

  it('computes the slot of a hash tag as Redis does (CLUSTER KEYSLOT)', async () => {
    const tags = ['', 'a', 'user:42', 'ip:2001:db8::1', 'key:0123456789abcdef0123456789abcdef', 'über-ñ', '😀', 'x'.repeat(300)];
    const slots = await Promise.all(tags.map((tag) => masters[0].call('CLUSTER', 'KEYSLOT', tag)));
    expect(tags.map(keySlot)).toEqual(slots.map(Number));
  });

  it('trips the frozen master’s breaker while the other two keep deciding', async () => {
    for (const list of names) expect((await timed(list[0])).decided).toBe(true);
    cluster.signal(2, 'SIGSTOP');
    try {
      // The healthy masters answer all the time, as they would under real traffic.
      let stop = false;
      const healthy: { ms: number; decided: boolean }[] = [];
      const traffic = (async () => {
        for (let i = 0; !stop; i++) healthy.push(await timed(names[i % 2][i % 12]));
      })();
      // Five waves of 12 simultaneous requests for buckets on the frozen master.
      const slow: number[] = [];
      for (let wave = 0; wave < 5; wave++) {
        const results = await Promise.all(names[2].map((name) => timed(name)));
        expect(results.every((r) => !r.decided)).toBe(true);
        // timeoutMs holds on a Cluster too: no request waits for the frozen master much longer than it.
        expect(Math.max(...results.map((r) => r.ms))).toBeLessThan(TIMEOUT_MS + 200);
        slow.push(results.filter((r) => r.ms >= TIMEOUT_MS * 0.8).length);
      }
      stop = true;
      await traffic;
      console.log(
        `requests for the frozen master that waited ~timeoutMs, per wave of 12: ${slow.join(', ')}; healthy decisions meanwhile: ${healthy.length}`,
      );
      // The first wave trips the breaker; from then on one probe at a time waits, the rest are answered at once.
      for (const count of slow.slice(1)) expect(count).toBeLessThanOrEqual(1);
      expect(healthy.length).toBeGreaterThan(20);
      expect(healthy.every((r) => r.decided)).toBe(true);
    } finally {
      cluster.signal(2, 'SIGCONT');
    }
    // Thawed: its next decision closes its breaker.
    const deadline = Date.now() + 10_000;
    while (!(await timed(names[2][0])).decided) {
      if (Date.now() > deadline) throw new Error('the thawed master never decided again');
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    expect(buckets.storeFailing).toBe(false);
    expect(await Promise.all(names[2].map((name) => timed(name).then((r) => r.decided)))).toEqual(names[2].map(() => true));
  }, 60_000);
});
