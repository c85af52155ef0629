import { createHash } from 'node:crypto';
import type { INestApplication } from '@nestjs/common';
import { Test, type TestingModule } from '@nestjs/testing';
import { Redis } from 'ioredis';
import request from 'supertest';
import { BucketService, RateLimitModule } from 'nest-redis-rate-limit';
import { ipIdentity } from '../../../libs/rate-limit/src/keys/identity-keys.js';
import { createApp, PLATFORMS } from '../../support/app.js';
import { deleteKeys, keysUnder, redisUrl, testPrefix } from '../../support/redis.js';
import { hostileAppModule } from './app.module.js';

const sha = (value: string) => createHash('sha256').update(value).digest('hex').slice(0, 32);
/** The longest identity a key can hold: `id:` and 64 plain characters (hashed ones are `kind~` and 32 hex digits). */
const MAX_IDENTITY = 3 + 64;
const IP = 'ip:127.0.0.1';

/** A key is one printable-ASCII word with exactly one hash tag, and no longer than prefix, tag and scope allow. */
function expectBounded(key: string, prefix: string, scope: string): void {
  expect(key.startsWith(prefix)).toBe(true);
  expect(key).toMatch(/^[\x21-\x7e]+$/);
  expect(key.split('{')).toHaveLength(2);
  expect(key.split('}')).toHaveLength(2);
  expect(key.endsWith(`}:${scope}`)).toBe(true);
  expect(key.length).toBeLessThanOrEqual(prefix.length + 1 + MAX_IDENTITY + 2 + scope.length);
}

/** The key a keyBy function's value gets: plain when short and plain, else its digest. */
const idKey = (prefix: string, value: string, scope: string) =>
  /^[A-Za-z0-9._:@-]{1,64}$/.test(value) ? `${prefix}{id:${value}}:${scope}` : `${prefix}{id~${sha(value)}}:${scope}`;

describe.each(PLATFORMS)('hostile and odd input on %s', (platform) => {
  const prefix = testPrefix(`hostile-input-${platform}`);
  const trustedPrefix = testPrefix(`hostile-input-trusted-${platform}`);
  let client: Redis;
  let app: INestApplication;
  let trusting: INestApplication;

  const get = (target: INestApplication, path: string, headers: Record<string, string> = {}) => {
    const req = request(target.getHttpServer()).get(path);
    for (const [name, value] of Object.entries(headers)) req.set(name, value);
    return req;
  };
  /** Status and remaining tokens of each request, in order. */
  const statuses = async (target: INestApplication, calls: [string, Record<string, string>?][]) => {
    const seen: [number, string | undefined][] = [];
    for (const [path, headers] of calls) {
      const response = await get(target, path, headers);
      seen.push([response.status, response.headers['x-ratelimit-remaining']]);
    }
    return seen;
  };

  beforeAll(async () => {
    const url = await redisUrl();
    client = new Redis(url);
    app = await createApp(hostileAppModule(url, prefix), platform);
    trusting = await createApp(hostileAppModule(url, trustedPrefix), platform, undefined, { trustProxy: true });
  });

  afterAll(async () => {
    await app?.close();
    await trusting?.close();
    await deleteKeys(client, prefix);
    await deleteKeys(client, trustedPrefix);
    await client.quit();
  });

  it('keeps an 8 KB API key out of Redis: a 32-digit digest, a bounded key, and a bucket of its own', async () => {
    const apiKey = 'k'.repeat(8 * 1024);
    const neighbour = `${'k'.repeat(8 * 1024 - 1)}j`;
    expect(
      await statuses(app, [
        ['/hostile/api-key', { 'x-api-key': apiKey }],
        ['/hostile/api-key', { 'x-api-key': apiKey }],
        ['/hostile/api-key', { 'x-api-key': apiKey }],
        ['/hostile/api-key', { 'x-api-key': neighbour }],
      ]),
    ).toEqual([
      [200, '1'],
      [200, '0'],
      [429, '0'],
      [200, '1'],
    ]);
    const keys = await keysUnder(client, `${prefix}{key`);
    expect(keys).toEqual(
      [`${prefix}{key:${sha(apiKey)}}:HostileController.apiKey`, `${prefix}{key:${sha(neighbour)}}:HostileController.apiKey`].sort(),
    );
    for (const key of keys) expectBounded(key, prefix, 'HostileController.apiKey');
  });

  const hostile = [
    '{',
    '}',
    '{}',
    'a{b}c',
    'x}:HostileController.ip',
    '}{',
    'line1\nline2',
    'line1\r\nline2',
    '\u0000',
    '\u0000\u0000',
    'tab\there',
    'ünïcödé',
    '日本語',
    '👍🏽',
    'a b',
    '%00',
    'plain:with:colons@x.y',
    'x'.repeat(64),
    'x'.repeat(65),
    'x'.repeat(8 * 1024),
  ];

  it(`gives each of ${hostile.length} identities with braces, colons, newlines, NUL, non-ASCII or excess length one bounded key of its own`, async () => {
    for (const value of hostile) {
      const response = await get(app, `/hostile/custom?id=${encodeURIComponent(value)}`);
      expect([JSON.stringify(value).slice(0, 20), response.status]).toEqual([JSON.stringify(value).slice(0, 20), 200]);
    }
    const keys = await keysUnder(client, `${prefix}{id`);
    expect(keys).toEqual(hostile.map((value) => idKey(prefix, value, 'HostileController.custom')).sort());
    for (const key of keys) expectBounded(key, prefix, 'HostileController.custom');
  });

  it("never lets one hostile identity drain another's bucket, or another route's", async () => {
    // '{' and '}' took one token each in the test before; 'x}:HostileController.ip' is no way into the ip route.
    expect(
      await statuses(app, [
        [`/hostile/custom?id=${encodeURIComponent('{')}`],
        [`/hostile/custom?id=${encodeURIComponent('{')}`],
        [`/hostile/custom?id=${encodeURIComponent('}')}`],
        [`/hostile/custom?id=${encodeURIComponent('x}:HostileController.ip')}`],
        [`/hostile/custom?id=${encodeURIComponent('x}:HostileController.ip')}`],
        ['/hostile/ip'],
      ]),
    ).toEqual([
      [200, '0'],
      [429, '0'],
      [200, '0'],
      [200, '0'],
      [429, '0'],
      [200, '1'],
    ]);
  });

  it('keeps a keyBy value that spells an IP identity out of that IP bucket, even in a shared named bucket', async () => {
    const spelled = `/hostile/shared-custom?id=${encodeURIComponent(IP)}`;
    expect(await statuses(app, [[spelled], [spelled], [spelled], ['/hostile/shared-ip']])).toEqual([
      [200, '1'],
      [200, '0'],
      [429, '0'],
      [200, '1'],
    ]);
    expect(await keysUnder(client, `${prefix}{`).then((keys) => keys.filter((k) => k.endsWith(':shared')))).toEqual(
      [`${prefix}{id:${IP}}:shared`, `${prefix}{${IP}}:shared`].sort(),
    );
  });

  it('uses the IP bucket for an empty API key, an empty keyBy value, an empty or unreadable user', async () => {
    expect(
      await statuses(app, [
        ['/hostile/api-key', { 'x-api-key': '' }],
        ['/hostile/custom?id='],
        ['/hostile/user', { 'x-user': '' }],
        ['/hostile/user', { 'x-user-throw': '1' }],
        ['/hostile/user', { 'x-user-throw': '1' }],
        ['/hostile/user', { 'x-user': '{admin}:é' }],
      ]),
    ).toEqual([
      [200, '1'],
      [200, '1'],
      [200, '1'],
      [200, '0'],
      [429, '0'],
      [200, '1'],
    ]);
    const keys = await keysUnder(client, prefix);
    expect(keys).toContain(`${prefix}{${IP}}:HostileController.apiKey`);
    expect(keys).toContain(`${prefix}{${IP}}:HostileController.custom`);
    expect(keys).toContain(`${prefix}{${IP}}:HostileController.user`);
    // Node reads header bytes as latin1: 'é' arrives as one character, and the id is hashed.
    expect(keys).toContain(`${prefix}{user~${sha('{admin}:é')}}:HostileController.user`);
  });

  it('answers a keyBy function that throws, rejects, hangs or returns a non-string from the IP bucket, never with a 500', async () => {
    const kinds = ['throw', 'reject', 'number', 'object', 'array', 'null', 'undefined', 'empty', 'boolean', 'hang'];
    const seen = await statuses(
      app,
      kinds.map((kind) => [`/hostile/misbehaving?kind=${kind}`] as [string]),
    );
    // One bucket for all ten (the one that never answers after timeoutMs): two allowed, then denied.
    expect(seen).toEqual([[200, '1'], [200, '0'], ...kinds.slice(2).map(() => [429, '0'])]);
    expect((await keysUnder(client, prefix)).filter((k) => k.endsWith(':HostileController.misbehaving'))).toEqual([
      `${prefix}{${IP}}:HostileController.misbehaving`,
    ]);
  });

  it('ignores a spoofed X-Forwarded-For when trust proxy is off', async () => {
    expect(
      await statuses(app, [
        ['/hostile/ip', { 'x-forwarded-for': '203.0.113.1' }],
        ['/hostile/ip', { 'x-forwarded-for': '203.0.113.2' }],
        ['/hostile/ip', { 'x-forwarded-for': '2001:db8::1, 203.0.113.3' }],
      ]),
    ).toEqual([
      [200, '0'],
      [429, '0'],
      [429, '0'],
    ]);
    expect((await keysUnder(client, prefix)).filter((k) => k.endsWith(':HostileController.ip'))).toEqual([
      `${prefix}{${IP}}:HostileController.ip`,
    ]);
  });

  it('honours X-Forwarded-For when trust proxy is on: one bucket per forwarded client', async () => {
    expect(
      await statuses(trusting, [
        ['/hostile/ip', { 'x-forwarded-for': '203.0.113.1' }],
        ['/hostile/ip', { 'x-forwarded-for': '203.0.113.1' }],
        ['/hostile/ip', { 'x-forwarded-for': '203.0.113.1' }],
        ['/hostile/ip', { 'x-forwarded-for': '203.0.113.2' }],
        ['/hostile/ip', { 'x-forwarded-for': '::ffff:203.0.113.2' }],
      ]),
    ).toEqual([
      [200, '1'],
      [200, '0'],
      [429, '0'],
      [200, '1'],
      [200, '0'],
    ]);
    expect(await keysUnder(client, `${trustedPrefix}{ip:203.`)).toEqual([
      `${trustedPrefix}{ip:203.0.113.1}:HostileController.ip`,
      `${trustedPrefix}{ip:203.0.113.2}:HostileController.ip`,
    ]);
  });

  it('groups forwarded IPv6 clients by their /64, however the address is written', async () => {
    expect(
      await statuses(trusting, [
        ['/hostile/ip', { 'x-forwarded-for': '2001:db8:aa:1::1' }],
        ['/hostile/ip', { 'x-forwarded-for': '2001:DB8:AA:1:ffff:ffff:ffff:fffe' }],
        ['/hostile/ip', { 'x-forwarded-for': '2001:0db8:00aa:0001:0:0:0:42' }],
        ['/hostile/ip', { 'x-forwarded-for': '2001:db8:aa:2::1' }],
      ]),
    ).toEqual([
      [200, '1'],
      [200, '0'],
      [429, '0'],
      [200, '1'],
    ]);
    const keys = await keysUnder(client, `${trustedPrefix}{ip:2001`);
    expect(keys).toEqual([
      `${trustedPrefix}{ip:2001:db8:aa:1::}:HostileController.ip`,
      `${trustedPrefix}{ip:2001:db8:aa:2::}:HostileController.ip`,
    ]);
  });

  it('hashes a forwarded address that is no IP address into a bounded key', async () => {
    const forged = ['{evil}', `${'9'.repeat(4096)}`, 'unknown:}{'];
    for (const value of forged) {
      const response = await get(trusting, '/hostile/ip', { 'x-forwarded-for': value });
      expect(response.status).toBe(200);
    }
    const keys = (await keysUnder(client, `${trustedPrefix}{ip~`)).sort();
    expect(keys).toEqual(forged.map((v) => `${trustedPrefix}{ip~${sha(v)}}:HostileController.ip`).sort());
    for (const key of keys) expectBounded(key, trustedPrefix, 'HostileController.ip');
  });
});

describe('client addresses as bucket identities', () => {
  it.each([
    ['127.0.0.1', 'ip:127.0.0.1'],
    ['::ffff:10.1.2.3', 'ip:10.1.2.3'],
    ['::FFFF:10.1.2.3', 'ip:10.1.2.3'],
    ['::1', 'ip:0:0:0:0::'],
    ['::', 'ip:0:0:0:0::'],
    ['2001:db8::', 'ip:2001:db8:0:0::'],
    ['2001:db8:1:2:3:4:5:6', 'ip:2001:db8:1:2::'],
    ['2001:0DB8:0001:0002::ffff', 'ip:2001:db8:1:2::'],
    ['fe80::1%eth0', 'ip:fe80:0:0:0::'],
    ['64:ff9b::192.0.2.1', 'ip:64:ff9b:0:0::'],
    [undefined, 'ip:unknown'],
    ['', 'ip:unknown'],
    ['not an address', `ip~${sha('not an address')}`],
  ])('%j is the identity %s', (address, expected) => {
    expect(ipIdentity(address)).toBe(expected);
  });
});

describe('BucketService names from untrusted input', () => {
  const prefix = testPrefix('hostile-input-service');
  let client: Redis;
  let moduleRef: TestingModule;
  let buckets: BucketService;
  const policy = { capacity: 1, refillPerSecond: 0.01 };

  beforeAll(async () => {
    const url = await redisUrl();
    client = new Redis(url);
    moduleRef = await Test.createTestingModule({ imports: [RateLimitModule.forRoot({ redis: url, keyPrefix: prefix })] }).compile();
    await moduleRef.init();
    buckets = moduleRef.get(BucketService);
  });

  afterAll(async () => {
    await moduleRef?.close();
    await deleteKeys(client, prefix);
    await client.quit();
  });

  it('hashes names with braces, newlines or 8 KB into bounded keys that never meet a route bucket', async () => {
    const names = [`{evil}\n${'x'.repeat(8 * 1024)}`, `${IP}}:HostileController.ip`, '{a}', '{b}', 'plain-name'];
    for (const name of names) expect((await buckets.consume(name, policy)).allowed).toBe(true);
    for (const name of names) expect((await buckets.consume(name, policy)).allowed).toBe(false);
    const keys = await keysUnder(client, prefix);
    expect(keys).toEqual([...names.slice(0, 4).map((name) => `${prefix}{~${sha(name)}}`), `${prefix}{plain-name}`].sort());
    for (const key of keys) {
      expect(key).toMatch(/^[\x21-\x7e]+$/);
      expect(key.length).toBeLessThanOrEqual(prefix.length + 2 + 64);
    }
  });
});
