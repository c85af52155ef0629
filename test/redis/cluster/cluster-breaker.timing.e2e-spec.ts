import { Test, type TestingModule } from '@nestjs/testing';
import { type Cluster, Redis } from 'ioredis';
import { BucketService, RateLimitModule, RateLimitUnavailableError } from 'nest-redis-rate-limit';
import { keySlot } from '../../../libs/rate-limit/src/stores/redis/cluster-slots.js';
import { LocalCluster } from '../../support/cluster.js';
import { watchLoopDelay } from '../../support/loop-delay.js';
import { hasRedisServerBinary, testPrefix } from '../../support/redis.js';
import { type Judgement, expectWithinBounds, judgeWaits, untilConclusive } from '../failure-modes/timing.js';

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

  /** How long one consume took (from `startedAt` to `endedAt`), and whether the store decided it (failureMode 'closed' throws otherwise). */
  interface Timed {
    ms: number;
    startedAt: number;
    endedAt: number;
    decided: boolean;
  }
  async function timed(name: string): Promise<Timed> {
    const startedAt = performance.now();
    let decided = true;
    try {
      await buckets.consume(name, policy);
    } catch (error) {
      if (!(error instanceof RateLimitUnavailableError)) throw error;
      decided = false;
    }
    const endedAt = performance.now();
    return { ms: endedAt - startedAt, startedAt, endedAt, decided };
  }

  it('computes the slot of a hash tag as Redis does (CLUSTER KEYSLOT)', async () => {
    const tags = ['', 'a', 'user:42', 'ip:2001:db8::1', 'key:0123456789abcdef0123456789abcdef', 'über-ñ', '😀', 'x'.repeat(300)];
    const slots = await Promise.all(tags.map((tag) => masters[0].call('CLUSTER', 'KEYSLOT', tag)));
    expect(tags.map(keySlot)).toEqual(slots.map(Number));
  });

  /**
   * The decisions the module's connection to master 2 has sent and not had answered: while it is frozen,
   * every one it was sent (coalesced calls counted by their keys, one per decision here).
   */
  const unansweredOnFrozen = () => {
    const node = client.nodes('master').find((n) => n.options.port === cluster.nodes[2].port);
    if (node === undefined) throw new Error('the cluster client has no connection to master 2');
    const queue = (node as unknown as { commandQueue: { toArray(): { command: { name: string; args: unknown[] } }[] } }).commandQueue;
    let decisions = 0;
    for (const { command } of queue.toArray()) {
      if (command.name === 'evalsha' || command.name === 'eval') decisions += Number(command.args[1]);
    }
    return decisions;
  };

  it('trips the frozen master’s breaker while the other two keep deciding', async () => {
    const WAVES = 5;
    // Thawed: its next decision closes its breaker.
    const thawed = async () => {
      const deadline = Date.now() + 10_000;
      while (!(await timed(names[2][0])).decided) {
        if (Date.now() > deadline) throw new Error('the thawed master never decided again');
        await new Promise((resolve) => setTimeout(resolve, 50));
      }
      expect(buckets.storeFailing).toBe(false);
    };
    const attempt = async (): Promise<Judgement[]> => {
      for (const list of names) expect((await timed(list[0])).decided).toBe(true);
      const loop = watchLoopDelay();
      const waves: Timed[][] = [];
      const healthy: Timed[] = [];
      let unanswered = -1;
      let stop = false;
      let traffic: Promise<void> | undefined;
      cluster.signal(2, 'SIGSTOP');
      try {
        // The healthy masters answer all the time, as they would under real traffic.
        traffic = (async () => {
          for (let i = 0; !stop; i++) healthy.push(await timed(names[i % 2][i % 12]));
        })();
        // Five waves of 12 simultaneous requests for buckets on the frozen master.
        for (let wave = 0; wave < WAVES; wave++) waves.push(await Promise.all(names[2].map((name) => timed(name))));
        stop = true;
        await traffic;
        unanswered = unansweredOnFrozen();
      } finally {
        // Also when a wave threw: no traffic outlives the test.
        stop = true;
        cluster.signal(2, 'SIGCONT');
        loop.stop();
        await traffic?.catch(() => undefined);
      }
      await thawed();
      expect(waves.flat().filter((r) => r.decided)).toEqual([]);
      // The first wave trips the breaker (all 12 were sent before 3 had failed); from then on one probe
      // per wave is sent to the frozen master, the rest are answered without it. Counted in the client,
      // so no load can change it: with one breaker for the whole Cluster, all 60 were sent.
      expect(unanswered).toBe(names[2].length + WAVES - 1);
      // ...and so, after the first wave, at most one request per wave waited for the deadline (a wait
      // is what remains of its time with the loop delay over it taken off).
      const slow = waves.map((results) => results.filter((r) => r.ms - loop.over(r.startedAt, r.endedAt) >= TIMEOUT_MS * 0.8).length);
      for (const count of slow.slice(1)) expect(count).toBeLessThanOrEqual(1);
      expect(healthy.length).toBeGreaterThan(20);
      expect(healthy.filter((r) => !r.decided)).toEqual([]);
      console.log(
        `decisions sent to the frozen master: ${unanswered}; requests that waited ~timeoutMs, per wave of 12: ${slow.join(', ')}; ` +
          `healthy decisions meanwhile: ${healthy.length}`,
      );
      // timeoutMs holds on a Cluster too: no request waits for the frozen master longer than it (+ 40 ms
      // and the loop delay over it: timing.ts of the failure-mode tests).
      const judgement = judgeWaits(waves.flat(), TIMEOUT_MS, loop);
      expectWithinBounds([judgement]);
      return [judgement];
    };
    await untilConclusive('a frozen Cluster master', attempt);
    expect(await Promise.all(names[2].map((name) => timed(name).then((r) => r.decided)))).toEqual(names[2].map(() => true));
  }, 60_000);
});
