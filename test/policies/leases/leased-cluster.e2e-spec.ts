import type { INestApplication } from '@nestjs/common';
import { type Cluster, Redis } from 'ioredis';
import { createApp } from '../../support/app.js';
import { LocalCluster } from '../../support/cluster.js';
import { hasRedisServerBinary, testPrefix } from '../../support/redis.js';
import { count, leasedIn, Loader } from './leased-load.js';
import { leasedSemanticsAppModule } from './leased-semantics.controllers.js';

/**
 * A leased policy on a Redis Cluster (issue 35, item 4): the lease lives in the bucket's hash on the node
 * that owns its slot, and two instances never admit more than the exact bucket would.
 */
describe('a leased policy on a Redis Cluster of 3 masters', () => {
  let cluster: LocalCluster;
  const clients: Cluster[] = [];
  const apps: INestApplication[] = [];
  const loader = new Loader();

  beforeAll(async () => {
    if (!hasRedisServerBinary()) throw new Error('the Redis Cluster tests need the redis-server binary on PATH');
    cluster = await LocalCluster.start(3);
  }, 60_000);

  afterAll(async () => {
    await Promise.all(apps.map((app) => app.close().catch(() => undefined)));
    await Promise.all(clients.map((client) => client.quit().catch(() => undefined)));
    loader.destroy();
    await cluster?.stop();
  });

  async function start(keyPrefix: string): Promise<string> {
    const client = await cluster.client();
    clients.push(client);
    const app = await createApp(leasedSemanticsAppModule({ redis: client, keyPrefix }), 'express');
    apps.push(app);
    await app.listen(0, '127.0.0.1');
    return app.getUrl();
  }

  it('keeps the lease on the node of the key, and two instances on a 1,000-token bucket refilling 20/s never admit more', async () => {
    const keyPrefix = testPrefix('leased-cluster');
    const key = `${keyPrefix}{id:everyone}:small`;
    const [a, b] = [await start(keyPrefix), await start(keyPrefix)];
    // The master that owns the key's slot, asked directly: the lease fields are there.
    const admin = new Redis({ host: cluster.nodes[0].host, port: cluster.nodes[0].port });
    const slot = Number(await admin.call('CLUSTER', 'KEYSLOT', key));
    const ranges = (await admin.call('CLUSTER', 'SLOTS')) as [number, number, [string, number]][];
    admin.disconnect();
    const [, , [host, port]] = ranges.find(([first, last]) => slot >= first && slot <= last)!;
    const owner = new Redis({ host, port: Number(port) });
    try {
      let leasedSeen = 0;
      let loading = true;
      const watching = (async () => {
        while (loading) {
          leasedSeen = Math.max(leasedSeen, leasedIn(await owner.hgetall(key)));
          await new Promise((r) => setTimeout(r, 5));
        }
      })();
      const started = Date.now();
      const [ra, rb] = await Promise.all([loader.load(`${a}/sem/small`, 1_000, 16), loader.load(`${b}/sem/small`, 1_000, 16)]);
      const seconds = (Date.now() - started) / 1000;
      loading = false;
      await watching;
      const admitted = count(ra, 200) + count(rb, 200);
      expect(count(ra, 200) + count(ra, 429) + count(rb, 200) + count(rb, 429)).toBe(2_000);
      expect(leasedSeen).toBeGreaterThan(0);
      expect(admitted).toBeLessThanOrEqual(1_000 + Math.ceil(20 * seconds));
      // Little is lost: at most a batch per instance per lease, and what refills meanwhile.
      expect(admitted).toBeGreaterThanOrEqual(1_000 - 2 * 20);
    } finally {
      owner.disconnect();
    }
  });
});
