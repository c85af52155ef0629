import { createHash } from 'node:crypto';
import type { INestApplication } from '@nestjs/common';
import { Test, type TestingModule } from '@nestjs/testing';
import { type Cluster, Redis } from 'ioredis';
import request from 'supertest';
import { BucketService, RateLimitModule } from 'nest-redis-rate-limit';
import { createApp, PLATFORMS } from '../../support/app.js';
import { LocalCluster } from '../../support/cluster.js';
import { commandCalls, hasRedisServerBinary, testPrefix, tokensOf } from '../../support/redis.js';
import { clusterAppModule } from './app.module.js';
import { clusterGates } from './cluster.controller.js';

/**
 * `RateLimitModule.forRoot({ redis: new Cluster([...]) })` against a local 3-master Redis Cluster.
 * Every allowed response must carry rate-limit headers: an error such as CROSSSLOT would otherwise
 * pass unseen as a failure-mode ('open') admission.
 */

/** The identity of an API key as the README documents it without `keys.secret`: `key:<32 hex digits of SHA-256>`. */
const apiKeyIdentity = (apiKey: string) => `key:${createHash('sha256').update(apiKey).digest('hex').slice(0, 32)}`;
/** A BucketService bucket as the README documents it: `{keyPrefix}{<name>}` (for a name of safe characters). */
const serviceKey = (prefix: string, name: string) => `${prefix}{${name}}`;

let cluster: LocalCluster;
/** Plain connections to each master, for per-node counts and scans. */
let masters: Redis[];
/** For each slot, the index of the master that owns it. */
let slotOwner: number[];

beforeAll(async () => {
  if (!hasRedisServerBinary()) throw new Error('the Redis Cluster tests need the redis-server binary on PATH');
  cluster = await LocalCluster.start(3);
  masters = cluster.nodes.map((n) => new Redis({ host: n.host, port: n.port }));
  const ranges = (await masters[0].call('CLUSTER', 'SLOTS')) as [number, number, [string, number]][];
  slotOwner = new Array<number>(16384);
  for (const [first, last, [, port]] of ranges) {
    const owner = cluster.nodes.findIndex((n) => n.port === Number(port));
    for (let slot = first; slot <= last; slot++) slotOwner[slot] = owner;
  }
}, 60_000);

afterAll(async () => {
  masters?.forEach((m) => m.disconnect());
  await cluster?.stop();
});

/** Index of the master holding `key`. */
async function ownerOf(key: string): Promise<number> {
  return slotOwner[Number(await masters[0].call('CLUSTER', 'KEYSLOT', key))];
}

/** Script calls (EVALSHA, and the EVAL that loads the script on a new connection) per master so far. */
function scriptCallsPerMaster(): Promise<number[]> {
  return Promise.all(masters.map(async (m) => (await commandCalls(m, 'evalsha')) + (await commandCalls(m, 'eval'))));
}

/**
 * 5 tokens less the one request that ran, plus what refilled since (SLOW a second: under half a token in
 * any run): a refused request that kept its token leaves less than 4, one given back twice more than 4.5.
 */
function expectFourLeft(tokens: number): void {
  expect(tokens).toBeGreaterThanOrEqual(4);
  expect(tokens).toBeLessThan(4.5);
}

describe.each(PLATFORMS)('a Redis Cluster of 3 masters on %s', (platform) => {
  const prefix = testPrefix(`cluster-${platform}`);
  let client: Cluster;
  let app: INestApplication;
  let url: string;

  beforeAll(async () => {
    client = await cluster.client();
    // Every denial must reach the cluster here (script calls per master, refunds): the deny cache, which
    // would answer repeated denials in process, has tests of its own (test/redis/deny-cache).
    app = await createApp(clusterAppModule({ redis: client, keyPrefix: prefix, denyCache: false }), platform);
    await app.listen(0, '127.0.0.1');
    url = await app.getUrl();
  });

  afterAll(async () => {
    await app?.close();
    await client?.quit();
  });

  async function tokens(key: string): Promise<number> {
    return tokensOf(client, key);
  }

  it('answers 30 simultaneous first requests from the store and spreads their 30 API-key buckets over all three masters', async () => {
    // The first decisions of the app: no master connection may still be opening (that would fail open).
    const responses = await Promise.all(
      Array.from({ length: 30 }, (_, i) => request(url).get('/cluster/per-key').set('x-api-key', `spread-${i}`)),
    );
    for (const res of responses) {
      expect(res.status).toBe(200);
      expect(res.headers['x-ratelimit-remaining']).toBe('4');
    }
    const perMaster = await Promise.all(masters.map(async (m) => (await m.keys(`${prefix}*:c-per-key`)).length));
    expect(perMaster.reduce((a, b) => a + b, 0)).toBe(30);
    for (const count of perMaster) expect(count).toBeGreaterThan(0);
  });

  it('decides a one-policy route: 3 allowed with headers, then 429 with Retry-After 100', async () => {
    for (let remaining = 2; remaining >= 0; remaining--) {
      const res = await request(url).get('/cluster/single').expect(200);
      expect(res.headers['x-ratelimit-limit']).toBe('3');
      expect(res.headers['x-ratelimit-remaining']).toBe(String(remaining));
    }
    const denied = await request(url).get('/cluster/single').expect(429);
    expect(denied.headers['retry-after']).toBe('100');
    expect(denied.body.retryAfter).toBe(100);
  });

  it('decides two policies on one identity in one script on the master owning the tag, all or nothing', async () => {
    const burstKey = `${prefix}{ip:127.0.0.1}:c-burst`;
    const quotaKey = `${prefix}{ip:127.0.0.1}:c-quota`;
    const owner = await ownerOf(burstKey);
    expect(await ownerOf(quotaKey)).toBe(owner);
    const before = await scriptCallsPerMaster();
    for (let i = 0; i < 3; i++) {
      const res = await request(url).get('/cluster/double').expect(200);
      expect(res.headers['x-ratelimit-limit']).toBe('3');
    }
    for (let i = 0; i < 5; i++) await request(url).get('/cluster/double').expect(429);
    const after = await scriptCallsPerMaster();
    // One script call per request, all on the owner.
    expect(after[owner] - before[owner]).toBe(8);
    expect(after.filter((_, i) => i !== owner)).toEqual(before.filter((_, i) => i !== owner));
    // The quota's 5 denials took nothing from the burst bucket.
    expect(await tokens(burstKey)).toBeGreaterThanOrEqual(7);
    expect(await tokens(burstKey)).toBeLessThan(7.1);
    expect(await tokens(quotaKey)).toBeLessThan(0.1);
  });

  it('decides policies on different identities group by group and gives back the IP group’s token when the API-key group refuses', async () => {
    const ipKey = `${prefix}{ip:127.0.0.1}:c-ip`;
    // An API key whose bucket lives on another master than the IP's.
    let apiKey = '';
    for (let i = 0; apiKey === ''; i++) {
      const candidate = `cluster-key-${i}`;
      if ((await ownerOf(`{${apiKeyIdentity(candidate)}}`)) !== (await ownerOf(ipKey))) apiKey = candidate;
    }
    const keyKey = `${prefix}{${apiKeyIdentity(apiKey)}}:c-key`;
    for (let i = 0; i < 3; i++) {
      const res = await request(url).get('/cluster/mixed').set('x-api-key', apiKey).expect(200);
      // The API-key bucket (3) has fewer tokens left than the IP bucket (10): it is the policy described.
      expect([res.headers['x-ratelimit-limit'], res.headers['x-ratelimit-remaining']]).toEqual(['3', String(2 - i)]);
    }
    expect(await tokens(ipKey)).toBeCloseTo(7, 1);
    for (let i = 0; i < 10; i++) {
      const denied = await request(url).get('/cluster/mixed').set('x-api-key', apiKey).expect(429);
      // The API-key bucket is empty (100 s to the next token): it is the policy described.
      expect(denied.headers['retry-after']).toBe('100');
      expect(denied.headers['x-ratelimit-limit']).toBe('3');
    }
    // Ten denials, each taking a token from the IP bucket and giving it back: still 7.
    const ipTokens = await tokens(ipKey);
    expect(ipTokens).toBeGreaterThanOrEqual(7);
    expect(ipTokens).toBeLessThan(7.1);
    expect(await tokens(keyKey)).toBeLessThan(0.1);
    // So the same IP with another API key is still allowed, with 6 IP tokens left.
    const other = await request(url).get('/cluster/mixed').set('x-api-key', `${apiKey}-other`).expect(200);
    // Its fresh API-key bucket has 2 of 3 left, the IP bucket 6 of 10: the API-key bucket is described.
    expect([other.headers['x-ratelimit-limit'], other.headers['x-ratelimit-remaining']]).toEqual(['3', '2']);
    expect(await tokens(ipKey)).toBeCloseTo(6, 1);
  });

  it('keeps each API key to one request in flight, its slots on the master owning its tag, and leaves none once all end', async () => {
    // Keys whose slots fall on each of the three masters.
    const keys: string[] = [];
    const owners = new Set<number>();
    for (let i = 0; keys.length < 3; i++) {
      const owner = await ownerOf(`${prefix}{${apiKeyIdentity(`slot-key-${platform}-${i}`)}}!c-slots`);
      if (owners.has(owner)) continue;
      owners.add(owner);
      keys.push(`slot-key-${platform}-${i}`);
    }
    const send = (key: string, id: string) =>
      request(app.getHttpServer())
        .get(`/cluster/slots/${id}`)
        .set('x-api-key', key)
        .then((r) => `${r.status} ${r.headers['concurrency-in-flight']}`);
    const first = keys.map((key, i) => send(key, `${platform}-held-${i}`));
    await clusterGates.waitingFor(3);
    expect(await Promise.all(keys.map((key, i) => send(key, `${platform}-refused-${i}`)))).toEqual(['429 1', '429 1', '429 1']);
    for (const key of keys) {
      const slots = `${prefix}{${apiKeyIdentity(key)}}!c-slots`;
      expect(await masters[await ownerOf(slots)].hget(slots, 'n')).toBe('1');
    }
    keys.forEach((_, i) => clusterGates.open(`${platform}-held-${i}`));
    expect(await Promise.all(first)).toEqual(['200 1', '200 1', '200 1']);
    // The refused requests took no token: 5 - 1 left of each key's rate bucket.
    for (const key of keys) expectFourLeft(await tokens(`${prefix}{${apiKeyIdentity(key)}}:c-slots-rate`));
    for (let i = 0; i < 100; i++) {
      const left = (await Promise.all(masters.map((m) => m.keys(`${prefix}*!c-slots`)))).flat();
      if (left.length === 0) break;
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    expect((await Promise.all(masters.map((m) => m.keys(`${prefix}*!c-slots`)))).flat()).toEqual([]);
    await clusterGates.openAll();
  });

  it('takes a rate policy and a slot on one API key in one script call on the master owning its tag', async () => {
    const key = `together-${platform}`;
    const slots = `${prefix}{${apiKeyIdentity(key)}}!c-together`;
    const owner = await ownerOf(slots);
    const send = (id: string) =>
      request(app.getHttpServer())
        .get(`/cluster/together/${id}`)
        .set('x-api-key', key)
        .then((r) => `${r.status} ${r.headers['concurrency-in-flight']}`);
    const before = await scriptCallsPerMaster();
    const held = send(`${platform}-together-held`);
    await clusterGates.waitingFor(1);
    expect(await send(`${platform}-together-refused`)).toBe('429 1');
    // Two requests, one call each, both on the owner: the slot and the bucket share the key's tag.
    const during = await scriptCallsPerMaster();
    expect(during.map((calls, i) => calls - before[i])).toEqual(masters.map((_, i) => (i === owner ? 2 : 0)));
    clusterGates.open(`${platform}-together-held`);
    expect(await held).toBe('200 1');
    // The refused request took no token.
    expectFourLeft(await tokens(`${prefix}{${apiKeyIdentity(key)}}:c-together-rate`));
    for (let i = 0; i < 100 && (await masters[owner].exists(slots)) === 1; i++) await new Promise((resolve) => setTimeout(resolve, 10));
    expect(await masters[owner].exists(slots)).toBe(0);
  });

  it('takes a rate policy and a slot on two hash tags apart, and gives the token back when the slot is refused', async () => {
    const send = (id: string) =>
      request(app.getHttpServer())
        .get(`/cluster/apart/${id}`)
        .set('x-api-key', `apart-${platform}`)
        .then((r) => `${r.status} ${r.headers['concurrency-in-flight']}`);
    const held = send(`${platform}-apart-held`);
    await clusterGates.waitingFor(1);
    for (let i = 0; i < 3; i++) expect(await send(`${platform}-apart-refused-${i}`)).toBe('429 1');
    clusterGates.open(`${platform}-apart-held`);
    expect(await held).toBe('200 1');
    // 5 - the one that ran: the three refused for their slot gave their tokens back.
    expectFourLeft(await tokens(`${prefix}{ip:127.0.0.1}:c-apart-rate`));
  });

  it('leaves the Cluster client it was given open when the app closes (the caller owns it)', async () => {
    await app.close();
    expect(client.status).toBe('ready');
    expect(await client.set(`${prefix}still-open`, '1')).toBe('OK');
  });
});

describe('BucketService.consumeAll on a Redis Cluster', () => {
  const prefix = testPrefix('cluster-service');
  const FIVE = { capacity: 5, refillPerSecond: 0.01 };
  const TEN = { capacity: 10, refillPerSecond: 0.01 };
  let client: Cluster;
  let moduleRef: TestingModule;
  let buckets: BucketService;

  beforeAll(async () => {
    client = await cluster.client();
    moduleRef = await Test.createTestingModule({
      imports: [RateLimitModule.forRoot({ redis: client, keyPrefix: prefix })],
    }).compile();
    await moduleRef.init();
    buckets = moduleRef.get(BucketService);
  });

  afterAll(async () => {
    await moduleRef?.close();
    await client?.quit();
  });

  /** Two bucket names whose keys live on different masters. */
  async function namesOnTwoMasters(stem: string): Promise<[string, string]> {
    const first = `${stem}-a`;
    const owner = await ownerOf(serviceKey(prefix, first));
    for (let i = 0; ; i++) {
      const second = `${stem}-b${i}`;
      if ((await ownerOf(serviceKey(prefix, second))) !== owner) return [first, second];
    }
  }

  it('gives back the first bucket’s tokens when the second, on another master, refuses', async () => {
    const [a, b] = await namesOnTwoMasters('refund');
    const entries = [
      { name: a, policy: TEN, cost: 4 },
      { name: b, policy: FIVE, cost: 3 },
    ];
    expect((await buckets.consumeAll(entries)).allowed).toBe(true);
    const denied = await buckets.consumeAll(entries);
    expect(denied.allowed).toBe(false);
    expect(denied.decisions.map((d) => d.remaining)).toEqual([6, 2]);
    expect((await buckets.peek(a, TEN)).remaining).toBe(6);
    expect((await buckets.peek(b, FIVE)).remaining).toBe(2);
  });

  it('never admits more than the tighter bucket allows under 40 simultaneous calls, and every token taken by a refused call comes back', async () => {
    const [large, small] = await namesOnTwoMasters('race');
    const decisions = await Promise.all(
      Array.from({ length: 40 }, () =>
        buckets.consumeAll([
          { name: large, policy: TEN },
          { name: small, policy: FIVE },
        ]),
      ),
    );
    const allowed = decisions.filter((d) => d.allowed).length;
    expect(allowed).toBeGreaterThan(0);
    expect(allowed).toBeLessThanOrEqual(5);
    // Whatever the interleaving: each bucket lost exactly one token per admitted call.
    expect((await buckets.peek(large, TEN)).remaining).toBe(10 - allowed);
    expect((await buckets.peek(small, FIVE)).remaining).toBe(5 - allowed);
  });
});

describe('coalescing on a Redis Cluster: one shared call per slot and turn', () => {
  const prefix = testPrefix('cluster-coalescing');
  let moduleRef: TestingModule;
  let client: Cluster;
  let buckets: BucketService;

  beforeAll(async () => {
    client = await cluster.client();
    moduleRef = await Test.createTestingModule({
      imports: [RateLimitModule.forRoot({ redis: client, keyPrefix: prefix, denyCache: false })],
    }).compile();
    await moduleRef.init();
    buckets = moduleRef.get(BucketService);
  });

  afterAll(async () => {
    await moduleRef?.close();
    await client?.quit();
  });

  it('takes and gives back BucketService slots, and keeps a priority reserve, on the master owning each name', async () => {
    const slotsKey = (name: string) => `${serviceKey(prefix, name)}!`;
    const names: string[] = [];
    const owners = new Set<number>();
    for (let i = 0; names.length < 3; i++) {
      const owner = await ownerOf(slotsKey(`slots-${i}`));
      if (owners.has(owner)) continue;
      owners.add(owner);
      names.push(`slots-${i}`);
    }
    const held = await Promise.all(names.map((name) => buckets.takeSlot(name, { limit: 2 })));
    const more = await Promise.all(names.map((name) => buckets.takeSlot(name, { limit: 2 })));
    const refused = await Promise.all(names.map((name) => buckets.takeSlot(name, { limit: 2 })));
    expect([...held, ...more].map((slot) => [slot.held, slot.source])).toEqual(Array(6).fill([true, 'store']));
    expect(refused.map((slot) => [slot.held, slot.inFlight])).toEqual([
      [false, 2],
      [false, 2],
      [false, 2],
    ]);
    for (const name of names) expect(await masters[await ownerOf(slotsKey(name))].hget(slotsKey(name), 'n')).toBe('2');
    await Promise.all([...held, ...more].map((slot) => slot.release()));
    for (const name of names) expect(await masters[await ownerOf(slotsKey(name))].exists(slotsKey(name))).toBe(0);

    // Priorities: sheddable keeps 20 % of 10 (stops at 2 tokens), critical takes the rest, in the same call.
    const POLICY = { capacity: 10, refillPerSecond: 1e-6 };
    const shed = [];
    for (let i = 0; i < 9; i++) shed.push((await buckets.consume(names[0], { ...POLICY, priority: 'sheddable' })).allowed);
    expect(shed.filter(Boolean)).toHaveLength(8);
    const critical = [];
    for (let i = 0; i < 3; i++) critical.push((await buckets.consume(names[0], { ...POLICY, priority: 'critical' })).allowed);
    expect(critical).toEqual([true, true, false]);
  });

  it('decides 15 simultaneous calls on each of 3 names on 3 masters in 2 calls per master, exactly 5 allowed each', async () => {
    const names: string[] = [];
    const owners = new Set<number>();
    for (let i = 0; names.length < 3; i++) {
      const owner = await ownerOf(serviceKey(prefix, `name-${i}`));
      if (!owners.has(owner)) {
        owners.add(owner);
        names.push(`name-${i}`);
      }
    }
    const FIVE = { capacity: 5, refillPerSecond: 1e-6 };
    const before = await scriptCallsPerMaster();
    const decisions = await Promise.all(names.flatMap((name) => Array.from({ length: 15 }, () => buckets.consume(name, FIVE))));
    const after = await scriptCallsPerMaster();
    names.forEach((_, n) => expect(decisions.slice(15 * n, 15 * n + 15).filter((d) => d.allowed)).toHaveLength(5));
    // Per slot: the first decision of the turn alone, the other 14 in one call.
    expect(after.map((calls, m) => calls - before[m])).toEqual([2, 2, 2]);
  });
});
