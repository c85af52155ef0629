import { Controller, Get, type INestApplication, Module } from '@nestjs/common';
import { Cluster } from 'ioredis';
import { RateLimit, RateLimitHealth, RateLimitInsights, RateLimitModule, type RateLimitModuleOptions } from 'nest-redis-rate-limit';
import request from 'supertest';
import { createApp } from '../../support/app.js';
import { LocalCluster } from '../../support/cluster.js';
import { RedisServer, testPrefix } from '../../support/redis.js';

/**
 * Issue 33, item 3: the way changes reach every instance survives a Redis restart and works on a
 * Cluster. While Redis is away an instance keeps what it last read (and its health says so); once Redis
 * is back, it takes what Redis holds (a restart without persistence: nothing) and new changes apply
 * within 2 s again. On a Cluster the operator's keys share one slot: one call per instance, one node.
 *
 * The two tests run at once (`it.concurrent`): each has servers and apps of its own, and each spends its
 * time waiting for the periodic call (a restart, a sync, a Cluster forming), so together they take about
 * as long as the longer one. No hook runs before them (jest starts concurrent tests before beforeAll).
 */
@Controller()
class ItemsController {
  @Get('items')
  @RateLimit({ capacity: 5, refillPerSecond: 1, name: 'items' })
  items() {
    return {};
  }
}

function appModule(options: RateLimitModuleOptions) {
  @Module({ imports: [RateLimitModule.forRoot({ operations: true, ...options })], controllers: [ItemsController] })
  class OutageModule {}
  return OutageModule;
}

async function within(ms: number, check: () => Promise<boolean> | boolean): Promise<void> {
  const start = Date.now();
  while (Date.now() - start < ms) {
    if (await check()) return;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  throw new Error(`not within ${ms} ms`);
}

const statusOf = async (app: INestApplication, ip: string) =>
  (await request(app.getHttpServer()).get('/items').set('x-forwarded-for', ip)).status;

/** Refused by a block (its wait is the block's, minutes), not by the bucket (a second at most). */
async function blocked(app: INestApplication, ip: string): Promise<boolean> {
  const res = await request(app.getHttpServer()).get('/items').set('x-forwarded-for', ip);
  return res.status === 429 && Number(res.headers['retry-after']) > 30;
}

describe('live changes through a Redis restart', () => {
  let server: RedisServer;
  const apps: INestApplication[] = [];

  afterAll(async () => {
    for (const app of apps) await app.close();
    await server?.stop();
  });

  it.concurrent(
    'keeps the blocks it read while Redis is away, drops them when Redis comes back empty, and applies new ones',
    async () => {
      server = await RedisServer.start();
      const options = { redis: server.url, keyPrefix: testPrefix('ops-restart') };
      const a = await createApp(appModule(options), 'express', (app) => app.useLogger(false), { trustProxy: true });
      const b = await createApp(appModule(options), 'express', (app) => app.useLogger(false), { trustProxy: true });
      apps.push(a, b);
      const ops = a.get(RateLimitInsights);
      await ops.block({ target: 'ip:192.0.2.1', seconds: 300, reason: 'outage test', by: 'ops' });
      await within(2_000, () => b.get(RateLimitHealth).status().operations?.blocks === 1);
      expect(await blocked(b, '192.0.2.1')).toBe(true);

      await server.stop();
      const health = b.get(RateLimitHealth);
      await within(4_000, () => health.status().operations?.syncFailing === true);
      // Still refused: the block is applied from memory, not from a call (failureMode decides the buckets).
      expect(await blocked(b, '192.0.2.1')).toBe(true);
      // A change while Redis is away is refused with the library's code (a 503 from an admin endpoint), not ioredis' words.
      await expect(ops.block({ target: 'ip:192.0.2.9', seconds: 300, reason: 'during the outage', by: 'ops' })).rejects.toHaveProperty(
        'code',
        'ERR_RATE_LIMIT_UNAVAILABLE',
      );
      await expect(ops.blocks()).rejects.toHaveProperty('code', 'ERR_RATE_LIMIT_UNAVAILABLE');
      expect(health.status().operations).toMatchObject({ blocks: 1, syncFailing: true });

      await server.start();
      // Redis came back without the keys (no persistence): what is in force is what it holds, nothing.
      await within(6_000, async () => health.status().operations?.syncFailing === false && (await statusOf(b, '192.0.2.1')) === 200);
      expect(health.status().operations).toMatchObject({ blocks: 0 });
      // The operator's change goes through app a: its own connection must be back too (b's sync says only
      // that b's is: a fresh clone's .ci/run of 2026-12-06 called a while it still reconnected).
      await within(6_000, () => {
        const status = a.get(RateLimitHealth).status();
        return status.reachable && status.operations?.syncFailing === false;
      });
      await ops.block({ target: 'ip:192.0.2.2', seconds: 300, reason: 'after the restart', by: 'ops' });
      await within(2_000, () => blocked(b, '192.0.2.2'));
    },
    30_000,
  );
});

describe('live changes on a Redis Cluster', () => {
  let cluster: LocalCluster;
  const clients: Cluster[] = [];
  const apps: INestApplication[] = [];

  afterAll(async () => {
    for (const app of apps) await app.close();
    for (const client of clients) client.disconnect();
    await cluster?.stop();
  });

  it.concurrent(
    'applies a block and an override made on one instance on the other within 2 s',
    async () => {
      cluster = await LocalCluster.start(3);
      const keyPrefix = testPrefix('ops-cluster');
      const connect = () => {
        const client = new Cluster(cluster.nodes, { enableOfflineQueue: false });
        clients.push(client);
        return client;
      };
      const [first, second] = [connect(), connect()];
      await Promise.all([first, second].map((client) => new Promise((resolve) => client.once('ready', resolve))));
      const a = await createApp(appModule({ redis: first, keyPrefix }), 'express', (app) => app.useLogger(false), { trustProxy: true });
      const b = await createApp(appModule({ redis: second, keyPrefix }), 'express', (app) => app.useLogger(false), { trustProxy: true });
      apps.push(a, b);
      const ops = a.get(RateLimitInsights);
      await ops.block({ target: 'ip:192.0.2.0/24', seconds: 60, reason: 'cluster', by: 'ops' });
      let host = 0;
      await within(2_000, () => blocked(b, `192.0.2.${++host}`));
      await ops.setOverride({ scope: 'items', capacity: 7, reason: 'cluster', by: 'ops' });
      await within(2_000, async () => (await b.get(RateLimitInsights).inspect('items', 'ip:198.51.100.1')).capacity === 7);
      const res = await request(b.getHttpServer()).get('/items').set('x-forwarded-for', '198.51.100.1');
      expect(res.status).toBe(200);
      expect(res.headers['ratelimit-limit']).toBe('7');
      expect(b.get(RateLimitHealth).status().operations).toMatchObject({ overrides: 1, blocks: 1, syncFailing: false });
    },
    60_000,
  );
});
