import type { Cluster } from 'ioredis';
import { Redis } from 'ioredis';
import { RedisBucketStore, type TakeResult } from 'nest-redis-rate-limit';
import type { PenaltyReport } from '../../../libs/rate-limit/src/stores/token-bucket.js';
import { LocalCluster } from '../../support/cluster.js';
import { hasRedisServerBinary, testPrefix } from '../../support/redis.js';

/**
 * Penalties on a Redis Cluster: buckets of different identities live in different slots and are decided
 * group by group (one script call per slot). A group that refuses penalises its own short buckets; the
 * groups before it get their tokens back (a refund leaves penalties alone).
 */
const T0 = 1_750_000_000_000;

describe('penalties on a Redis Cluster of 3 masters', () => {
  const prefix = testPrefix('penalties-cluster');
  let cluster: LocalCluster;
  let client: Cluster;
  let admin: Redis;
  let store: RedisBucketStore;

  beforeAll(async () => {
    if (!hasRedisServerBinary()) throw new Error('the Redis Cluster tests need the redis-server binary on PATH');
    cluster = await LocalCluster.start(3);
    client = await cluster.client();
    admin = new Redis({ host: cluster.nodes[0].host, port: cluster.nodes[0].port });
    store = new RedisBucketStore(client, false);
  }, 60_000);

  afterAll(async () => {
    await client?.quit();
    admin?.disconnect();
    await cluster?.stop();
  });

  /** Two keys whose slots are on different masters (so the store decides them in two calls). */
  async function keysOnTwoMasters(stem: string): Promise<[string, string]> {
    const slots = (await admin.call('CLUSTER', 'SLOTS')) as [number, number, [string, number]][];
    const owner = async (key: string) => {
      const slot = Number(await admin.call('CLUSTER', 'KEYSLOT', key));
      return slots.findIndex(([first, last]) => slot >= first && slot <= last);
    };
    const first = `${prefix}{${stem}-a}`;
    const own = await owner(first);
    for (let i = 0; ; i++) {
      const second = `${prefix}{${stem}-b${i}}`;
      if ((await owner(second)) !== own) return [first, second];
    }
  }

  it('a refusal in the second group penalises only its short bucket and refunds the first group', async () => {
    const [roomy, short] = await keysOnTwoMasters('groups');
    const requests = [
      { key: roomy, capacity: 5, refillPerSecond: 1, cost: 1, blockSeconds: 10 },
      { key: short, capacity: 1, refillPerSecond: 1, cost: 1, blockSeconds: 10 },
    ];
    expect(await store.take(requests, { now: T0 })).toEqual({ allowed: true, tokens: [4, 0], penaltyMs: [0, 0] });
    const refused: TakeResult & PenaltyReport = await store.take(requests, { now: T0 });
    expect(refused).toEqual({ allowed: false, tokens: [4, -9], penaltyMs: [0, 10_000] });
    expect(await client.exists(short)).toBe(1);
    expect(await client.hgetall(short)).toEqual({ tokens: '-9', ts: String(T0), b: String(T0 + 10_000) });
    expect(await client.hgetall(roomy)).toEqual({ tokens: '4', ts: String(T0) });
    // During the penalty: refused, nothing written, the first group refunded again.
    expect(await store.take(requests, { now: T0 + 5_000 })).toEqual({ allowed: false, tokens: [5, -4], penaltyMs: [0, 5_000] });
    expect(await client.hgetall(short)).toEqual({ tokens: '-9', ts: String(T0), b: String(T0 + 10_000) });
    expect(await store.take(requests, { now: T0 + 10_000 })).toEqual({ allowed: true, tokens: [4, 0], penaltyMs: [0, 0] });
  });
});
