import { Controller, Get, type INestApplication } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { type Cluster, Redis } from 'ioredis';
import request from 'supertest';
import { RateLimit, RateLimitConfigError, RateLimitModule } from 'nest-redis-rate-limit';
import { createRedisTestPrefix, type RedisTestPrefix } from 'nest-redis-rate-limit/testing';
import { LocalCluster } from '../../support/cluster.js';
import { freePort, hasRedisServerBinary, keysUnder, redisUrl } from '../../support/redis.js';

/**
 * `createRedisTestPrefix` (nest-redis-rate-limit/testing), against the shared Redis and a local Cluster:
 * `cleanup()` removes every key under its own prefix (however many SCAN steps they take, whatever their
 * type), and nothing else: not a neighbour's prefix, nor keys that only look like its own.
 */

@Controller('limited')
@RateLimit(2, 1 / 3600)
class LimitedController {
  @Get()
  get() {
    return 'ok';
  }
}

/** Writes `count` string keys named `<prefix><tag>:<i>` in pipelines (on a Cluster: `{tag<i>}`, spread over slots). */
async function fill(client: Redis | Cluster, prefix: string, count: number, spread = false): Promise<string[]> {
  const keys = Array.from({ length: count }, (_, i) => (spread ? `${prefix}{tag${i}}:k` : `${prefix}filler:${i}`));
  for (let i = 0; i < keys.length; i += 200) {
    await Promise.all(keys.slice(i, i + 200).map((key) => client.set(key, '1', 'EX', 600)));
  }
  return keys;
}

describe('createRedisTestPrefix on one Redis server', () => {
  let client: Redis;
  let url: string;
  /** Keys a test wrote outside every prefix the helper hands out; removed by name at the end. */
  const strays: string[] = [];
  const spaces: RedisTestPrefix[] = [];
  const space = (name?: string) => {
    const made = createRedisTestPrefix(client, name === undefined ? {} : { name });
    spaces.push(made);
    return made;
  };

  beforeAll(async () => {
    url = await redisUrl();
    client = new Redis(url);
  });

  afterAll(async () => {
    for (const made of spaces) await made.cleanup();
    if (strays.length > 0) await client.del(...strays);
    await client.quit();
  });

  it('hands out prefixes of the form test:<name>:<12 hex digits>:, a new one at each call', () => {
    const a = space('orders');
    const b = space('orders');
    expect(a.keyPrefix).toMatch(/^test:orders:[0-9a-f]{12}:$/);
    expect(b.keyPrefix).toMatch(/^test:orders:[0-9a-f]{12}:$/);
    expect(b.keyPrefix).not.toBe(a.keyPrefix);
    expect(space().keyPrefix).toMatch(/^test:test:[0-9a-f]{12}:$/);
  });

  it("removes the module's keys and every other key under its prefix, and leaves a neighbour's and look-alikes", async () => {
    const mine = space('module-testing');
    const neighbour = space('module-testing');
    const app: INestApplication = (
      await Test.createTestingModule({
        imports: [RateLimitModule.forRoot({ redis: client, keyPrefix: mine.keyPrefix })],
        controllers: [LimitedController],
      }).compile()
    ).createNestApplication({ logger: false });
    await app.init();
    try {
      const statuses = [];
      for (let i = 0; i < 3; i++) statuses.push((await request(app.getHttpServer()).get('/limited')).status);
      expect(statuses).toEqual([200, 200, 429]);
    } finally {
      await app.close();
    }
    const written = await keysUnder(client, mine.keyPrefix);
    // The module wrote its one bucket under the prefix (the client's address as supertest connects: IPv4 or IPv6).
    expect(written).toEqual([expect.stringMatching(/^test:module-testing:[0-9a-f]{12}:\{ip:[^}]+\}:LimitedController\.get$/)]);

    // More keys than one SCAN step returns, and other types than the module's hashes.
    const filler = await fill(client, mine.keyPrefix, 1_234);
    await client.rpush(`${mine.keyPrefix}list`, 'a', 'b');
    await client.sadd(`${mine.keyPrefix}set`, 'a');
    // The neighbour's keys, and keys that share the beginning of the prefix or hold it elsewhere in their name.
    const theirs = await fill(client, neighbour.keyPrefix, 30);
    const lookAlikes = [
      mine.keyPrefix.slice(0, -1), // the prefix without its closing ':'
      `${mine.keyPrefix.slice(0, -2)}x:filler:1`, // the last hex digit differs
      `other:${mine.keyPrefix}filler:1`, // the prefix, not at the start
      mine.keyPrefix.toUpperCase() + 'k', // another case: Redis keys are case-sensitive
    ];
    strays.push(...lookAlikes);
    for (const key of lookAlikes) await client.set(key, '1', 'EX', 600);
    const expected = 1 + filler.length + 2;
    expect(await keysUnder(client, mine.keyPrefix)).toHaveLength(expected);

    expect(await mine.cleanup()).toBe(expected);

    expect(await keysUnder(client, mine.keyPrefix)).toEqual([]);
    expect(await keysUnder(client, neighbour.keyPrefix)).toEqual([...theirs].sort());
    expect(await client.exists(...lookAlikes)).toBe(lookAlikes.length);
    // The client passed in is left open (you close it), and a second call finds nothing more to remove.
    expect(client.status).toBe('ready');
    expect(await mine.cleanup()).toBe(0);
  });

  it('takes a redis:// URL: cleanup() opens a connection of its own, removes the keys and closes it', async () => {
    const mine = createRedisTestPrefix(url, { name: 'by-url' });
    spaces.push(mine);
    const neighbour = space('by-url');
    const written = await fill(client, mine.keyPrefix, 12);
    const theirs = await fill(client, neighbour.keyPrefix, 3);
    const named = async () =>
      ((await client.client('LIST')) as string)
        .split('\n')
        .filter((line) => line.includes(` name=createRedisTestPrefix:${mine.keyPrefix} `));
    expect(await mine.cleanup()).toBe(written.length);
    expect(await keysUnder(client, mine.keyPrefix)).toEqual([]);
    expect(await keysUnder(client, neighbour.keyPrefix)).toEqual([...theirs].sort());
    // Its connection is gone (the server may see the close a moment after cleanup() resolved).
    for (let i = 0; i < 50 && (await named()).length > 0; i++) await new Promise((resolve) => setTimeout(resolve, 20));
    expect(await named()).toEqual([]);
  });

  it('rejects cleanup() at once when the URL answers nothing, without retrying', async () => {
    const port = await freePort();
    const nobody = createRedisTestPrefix(`redis://user:secret@127.0.0.1:${port}`);
    const started = Date.now();
    const error = await nobody.cleanup().then(
      () => undefined,
      (e: unknown) => e as Error,
    );
    expect(error?.message).toMatch(
      new RegExp(
        `^createRedisTestPrefix: cleanup\\(\\) could not connect to redis://user:\\*\\*\\*@127\\.0\\.0\\.1:${port}: .*ECONNREFUSED`,
      ),
    );
    // ioredis' default would retry for ever; one refused connection takes milliseconds.
    expect(Date.now() - started).toBeLessThan(5_000);
  });

  it('refuses a name outside 1-40 of A-Z a-z 0-9 . _ : -, something that is not a URL or a client, and a client with its own keyPrefix', () => {
    for (const name of ['', 'with space', 'brace{', 'glob*', 'x'.repeat(41)]) {
      expect(() => createRedisTestPrefix(client, { name })).toThrow(RateLimitConfigError);
      expect(() => createRedisTestPrefix(client, { name })).toThrow(/createRedisTestPrefix: name must be 1-40 characters/);
    }
    expect(() => createRedisTestPrefix(client, { name: 'x'.repeat(40) })).not.toThrow();
    for (const redis of ['127.0.0.1:6379', 'http://127.0.0.1:6379', 6379, undefined, {}]) {
      expect(() => createRedisTestPrefix(redis as never)).toThrow(
        expect.objectContaining({
          code: 'ERR_RATE_LIMIT_INVALID_REDIS_OPTION',
          message: expect.stringMatching(/^createRedisTestPrefix: redis must be/),
        }),
      );
    }
    const prefixed = new Redis(url, { keyPrefix: 'app:', lazyConnect: true });
    expect(() => createRedisTestPrefix(prefixed)).toThrow(/ioredis' own keyPrefix option/);
    prefixed.disconnect();
  });
});

const describeCluster = hasRedisServerBinary() ? describe : describe.skip;

describeCluster('createRedisTestPrefix on a Redis Cluster (3 masters)', () => {
  let cluster: LocalCluster;
  let client: Cluster;

  beforeAll(async () => {
    cluster = await LocalCluster.start(3);
    client = await cluster.client({ enableOfflineQueue: true });
  }, 60_000);

  afterAll(async () => {
    await client?.quit();
    await cluster?.stop();
  });

  /** Keys under `prefix` on each master, by SCAN on that node. */
  const perMaster = async (prefix: string) => {
    const counts = [];
    for (const node of client.nodes('master')) counts.push(await keysUnder(node, prefix).then((keys) => keys.length));
    return counts;
  };

  it("scans every master: removes its keys from all three, and leaves a neighbour's", async () => {
    const mine = createRedisTestPrefix(client, { name: 'cluster' });
    const neighbour = createRedisTestPrefix(client, { name: 'cluster' });
    const written = await fill(client, mine.keyPrefix, 600, true);
    const theirs = await fill(client, neighbour.keyPrefix, 60, true);
    const before = await perMaster(mine.keyPrefix);
    expect(before).toHaveLength(3);
    // Spread over the slots, every master holds some of them: a cleanup of one node would leave keys behind.
    for (const count of before) expect(count).toBeGreaterThan(0);
    expect(before.reduce((a, b) => a + b, 0)).toBe(written.length);

    expect(await mine.cleanup()).toBe(written.length);

    expect(await perMaster(mine.keyPrefix)).toEqual([0, 0, 0]);
    const left = (await perMaster(neighbour.keyPrefix)).reduce((a, b) => a + b, 0);
    expect(left).toBe(theirs.length);
    expect(await neighbour.cleanup()).toBe(theirs.length);
  });
});
