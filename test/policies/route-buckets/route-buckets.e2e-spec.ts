import { createHmac } from 'node:crypto';
import { type INestApplication, Module } from '@nestjs/common';
import { Redis } from 'ioredis';
import request from 'supertest';
import { BucketService, type FailureMode, MemoryBucketStore, RateLimitModule, RateLimitUnavailableError } from 'nest-redis-rate-limit';
import { resolveOptions } from '../../../libs/rate-limit/src/rate-limit.options-resolver.js';
import { createApp, PLATFORMS, type Platform } from '../../support/app.js';
import { deleteKeys, RedisServer, redisUrl, testPrefix, tokensOf } from '../../support/redis.js';
import { RouteBucketsController } from './route-buckets.controller.js';

/**
 * README, "Route buckets by identity": `BucketService.peekRoute(scope, who)` and `resetRoute(scope, who)`
 * name the very key the route limiter drains for that identity — addresses normalised as the limiter
 * does (IPv4-mapped IPv6 is the IPv4 client), user ids, keyBy results and API keys digested with
 * `keys.secret` — and a reset also forgets this instance's deny-cache entry.
 */
const SECRET = 'route-buckets-secret-32-chars!!!';
const hmac = (value: string) => createHmac('sha256', SECRET).update(value).digest('hex').slice(0, 32);
/** The accounts behind the keys this app issued (`keys.apiKey` answers the account). */
const ACCOUNTS = new Map([
  ['sk_live_alpha', 'acct-1'],
  ['sk_live_beta', 'acct-2'],
]);
const IP_SCOPE = 'RouteBucketsController.byIp';
/** One token per 1000 s: a drained bucket's next token is 1000 s away, its refill to full 2000 s. */
const WAIT = 1000;
/** The error of a wrong call: its code, and the library's wording (the message without the code's lines). */
const refused = (code: string, reason: string) => expect.objectContaining({ code, reason });

function routeBucketsModule(redis: string, keyPrefix: string, extra: { failureMode?: FailureMode } = {}) {
  @Module({
    imports: [
      RateLimitModule.forRoot({
        redis,
        keyPrefix,
        keys: { secret: SECRET, apiKey: (req) => ACCOUNTS.get(req.headers['x-api-key']) },
        ...extra,
      }),
    ],
    controllers: [RouteBucketsController],
  })
  class RouteBucketsAppModule {}
  return RouteBucketsAppModule;
}

describe.each(PLATFORMS)('route buckets by identity on %s', (platform: Platform) => {
  const prefix = testPrefix(`route-buckets-${platform}`);
  let client: Redis;
  let app: INestApplication;
  let buckets: BucketService;

  beforeAll(async () => {
    const url = await redisUrl();
    client = new Redis(url);
    app = await createApp(routeBucketsModule(url, prefix), platform, undefined, { trustProxy: true });
    buckets = app.get(BucketService);
  });

  afterAll(async () => {
    await app?.close();
    await deleteKeys(client, prefix);
    client?.disconnect();
  });

  const key = (identity: string, scope: string) => `${prefix}{${identity}}:${scope}`;
  const get = (path: string, headers: Record<string, string>) => {
    let req = request(app.getHttpServer()).get(path);
    for (const [name, value] of Object.entries(headers)) req = req.set(name, value);
    return req;
  };
  /** Drains the bucket with two allowed requests; answers the Retry-After of the third, a 429 from Redis. */
  async function drain(path: string, headers: Record<string, string>): Promise<number> {
    expect((await get(path, headers)).status).toBe(200);
    expect((await get(path, headers)).status).toBe(200);
    const refused = await get(path, headers);
    expect(refused.status).toBe(429);
    return Number(refused.headers['retry-after']);
  }
  /** What peekRoute answers for a drained bucket: refused, with the wait the 429 announced. */
  const drained = (retry: number) => ({
    allowed: false,
    limit: 2,
    remaining: 0,
    retryAfterSeconds: retry,
    resetSeconds: expect.any(Number),
  });
  /** The bucket holds one token (one request taken, none refilled yet in any measurable way). */
  async function expectOneToken(bucketKey: string): Promise<void> {
    const tokens = await tokensOf(client, bucketKey);
    expect(tokens).toBeGreaterThanOrEqual(1);
    expect(tokens).toBeLessThan(1.01);
  }

  it('peeks and resets the per-IP bucket of a route, and no other client’s', async () => {
    await get('/buckets/ip', { 'x-forwarded-for': '203.0.113.11' }).expect(200);
    const retry = await drain('/buckets/ip', { 'x-forwarded-for': '203.0.113.10' });
    expect(retry).toBe(WAIT);

    const peeked = await buckets.peekRoute(IP_SCOPE, { ip: '203.0.113.10' });
    expect(peeked).toEqual(drained(retry));
    expect(peeked.resetSeconds).toBeGreaterThanOrEqual(2 * WAIT - 1);
    expect(peeked.resetSeconds).toBeLessThanOrEqual(2 * WAIT);
    // A peek reports the tokens the bucket holds: one left, so the next request is allowed.
    expect(await buckets.peekRoute(IP_SCOPE, { ip: '203.0.113.11' })).toMatchObject({ allowed: true, remaining: 1 });

    await buckets.resetRoute(IP_SCOPE, { ip: '203.0.113.10' });
    expect(await client.exists(key('ip:203.0.113.10', IP_SCOPE))).toBe(0);
    await expectOneToken(key('ip:203.0.113.11', IP_SCOPE));

    const again = await get('/buckets/ip', { 'x-forwarded-for': '203.0.113.10' });
    expect(again.status).toBe(200);
    expect(again.headers['x-ratelimit-remaining']).toBe('1');
    await get('/buckets/ip', { 'x-forwarded-for': '203.0.113.11' }).expect(200);
    await get('/buckets/ip', { 'x-forwarded-for': '203.0.113.11' }).expect(429);
  });

  it.each([
    ['/buckets/ip', { 'x-forwarded-for': '203.0.113.12' }, IP_SCOPE, { ip: '203.0.113.12' }, 'ip:203.0.113.12'],
    ['/buckets/login', { 'x-user': 'grace' }, 'login', { user: 'grace' }, 'user:grace'],
  ] as const)('does not let the deny cache answer for a bucket resetRoute made full (%s)', async (path, headers, scope, who, identity) => {
    await drain(path, headers);
    // Behind the module's back: Redis would now allow (the bucket is gone), yet this instance still
    // refuses, from its deny cache — which is what resetRoute() must clear.
    expect(await client.del(key(identity, scope))).toBe(1);
    expect(await buckets.peekRoute(scope, who)).toMatchObject({ allowed: true, remaining: 2 });
    await get(path, headers).expect(429);

    await buckets.resetRoute(scope, who);
    await get(path, headers).expect(200);
  });

  it('treats an IPv4-mapped address as the IPv4 client, as the limiter does', async () => {
    const retry = await drain('/buckets/ip', { 'x-forwarded-for': '::ffff:198.51.100.7' });
    expect(await tokensOf(client, key('ip:198.51.100.7', IP_SCOPE))).toBeLessThan(0.01);
    expect(await buckets.peekRoute(IP_SCOPE, { ip: '198.51.100.7' })).toEqual(drained(retry));
    expect(await buckets.peekRoute(IP_SCOPE, { ip: '0:0:0:0:0:FFFF:C633:6407' })).toEqual(drained(retry));

    await buckets.resetRoute(IP_SCOPE, { ip: '::ffff:c633:6407' });
    expect(await client.exists(key('ip:198.51.100.7', IP_SCOPE))).toBe(0);
    const again = await get('/buckets/ip', { 'x-forwarded-for': '198.51.100.7' });
    expect(again.status).toBe(200);
    expect(again.headers['x-ratelimit-remaining']).toBe('1');
  });

  it('peeks and resets a user’s login bucket (keyBy: user), plain and hashed ids alike', async () => {
    await get('/buckets/login', { 'x-user': 'ada lovelace' }).expect(200);
    const retry = await drain('/buckets/login', { 'x-user': '42' });
    expect(await tokensOf(client, key('user:42', 'login'))).toBeLessThan(0.01);
    expect(await buckets.peekRoute('login', { user: 42 })).toEqual(drained(retry));
    expect(await buckets.peekRoute('login', { user: '42' })).toEqual(drained(retry));
    expect(await buckets.peekRoute('login', { user: 'ada lovelace' })).toMatchObject({ allowed: true, remaining: 1 });

    await buckets.resetRoute('login', { user: 42 });
    expect(await client.exists(key('user:42', 'login'))).toBe(0);
    await expectOneToken(key(`user~${hmac('ada lovelace')}`, 'login'));
    await get('/buckets/login', { 'x-user': '42' }).expect(200);

    // The hashed id, through the same digest with keys.secret.
    await buckets.resetRoute('login', { user: 'ada lovelace' });
    expect(await client.exists(key(`user~${hmac('ada lovelace')}`, 'login'))).toBe(0);
    await expectOneToken(key('user:42', 'login'));
  });

  it('resets the IP bucket a user-keyed policy falls back to for a request without a user', async () => {
    const retry = await drain('/buckets/login', { 'x-forwarded-for': '203.0.113.20' });
    expect(await buckets.peekRoute('login', { ip: '203.0.113.20' })).toEqual(drained(retry));
    await buckets.resetRoute('login', { ip: '203.0.113.20' });
    expect(await client.exists(key('ip:203.0.113.20', 'login'))).toBe(0);
    await get('/buckets/login', { 'x-forwarded-for': '203.0.113.20' }).expect(200);
  });

  it('peeks and resets the bucket of a verified API key, digested with keys.secret', async () => {
    await get('/buckets/key', { 'x-api-key': 'sk_live_beta' }).expect(200);
    const retry = await drain('/buckets/key', { 'x-api-key': 'sk_live_alpha' });
    const alpha = key(`key:${hmac('acct-1')}`, 'per-key');
    const beta = key(`key:${hmac('acct-2')}`, 'per-key');
    expect(await tokensOf(client, alpha)).toBeLessThan(0.01);
    expect(await buckets.peekRoute('per-key', { apiKey: 'acct-1' })).toEqual(drained(retry));

    await buckets.resetRoute('per-key', { apiKey: 'acct-1' });
    expect(await client.exists(alpha)).toBe(0);
    await expectOneToken(beta);
    await get('/buckets/key', { 'x-api-key': 'sk_live_alpha' }).expect(200);
  });

  it('peeks and resets the bucket of what a keyBy function returned', async () => {
    const retry = await drain('/buckets/tenant', { 'x-tenant': 'tenant-7' });
    expect(await buckets.peekRoute('tenant', { id: 'tenant-7' })).toEqual(drained(retry));
    await buckets.resetRoute('tenant', { id: 'tenant-7' });
    expect(await client.exists(key('id:tenant-7', 'tenant'))).toBe(0);
    await get('/buckets/tenant', { 'x-tenant': 'tenant-7' }).expect(200);
  });

  it('reports the wait of a penalty (blockSeconds) as the 429 did', async () => {
    const headers = { 'x-forwarded-for': '203.0.113.50' };
    const retry = await drain('/buckets/penalised', headers);
    expect(retry).toBe(30);
    expect(await buckets.peekRoute('penalised', { ip: '203.0.113.50' })).toMatchObject({
      allowed: false,
      remaining: 0,
      retryAfterSeconds: 30,
    });
    await buckets.resetRoute('penalised', { ip: '203.0.113.50' });
    await get('/buckets/penalised', headers).expect(200);
  });

  it('names the scope it does not know, and lists those it does', async () => {
    await expect(buckets.resetRoute('logn', { user: 42 })).rejects.toThrow(
      refused(
        'ERR_RATE_LIMIT_UNKNOWN_SCOPE',
        'BucketService.resetRoute("logn"): no route policy has the scope "logn" (a policy\'s name, or ' +
          'Controller.handler for an unnamed one); known scopes: "RouteBucketsController.byIp", "dynamic", ' +
          '"login", "penalised", "per-key", "shared", "tenant"',
      ),
    );
    await expect(buckets.peekRoute('RouteBucketsController.ip', { ip: '1.2.3.4' })).rejects.toThrow(
      /^BucketService.peekRoute\("RouteBucketsController.ip"\): no route policy has the scope/,
    );
  });

  it('refuses an identity the scope never keys a bucket by, and malformed identities', async () => {
    await expect(buckets.resetRoute(IP_SCOPE, { user: 42 })).rejects.toThrow(
      refused(
        'ERR_RATE_LIMIT_INVALID_IDENTITY',
        `BucketService.resetRoute("${IP_SCOPE}"): the policies of scope "${IP_SCOPE}" key buckets by ip, never by user: that bucket does not exist`,
      ),
    );
    await expect(buckets.peekRoute('login', { apiKey: 'acct-1' })).rejects.toThrow(
      'the policies of scope "login" key buckets by ip or user, never by apiKey',
    );
    await expect(buckets.resetRoute('login', { ip: '1.2.3.4', user: 42 } as never)).rejects.toThrow(
      refused(
        'ERR_RATE_LIMIT_INVALID_IDENTITY',
        'BucketService.resetRoute("login"): the identity must have exactly one of { ip } | { user } | { apiKey } | { id } (got keys ip, user)',
      ),
    );
    await expect(buckets.peekRoute('login', { user: '' })).rejects.toThrow(
      refused(
        'ERR_RATE_LIMIT_INVALID_IDENTITY',
        'BucketService.peekRoute("login"): user must be a non-empty string or a finite number (got an empty string)',
      ),
    );
    await expect(buckets.resetRoute('login', { user: Number.NaN })).rejects.toThrow(
      'user must be a non-empty string or a finite number (got NaN)',
    );
  });

  it('asks for the numbers when the routes of a name disagree on them, or compute them per request', async () => {
    await expect(buckets.peekRoute('shared', { ip: '203.0.113.30' })).rejects.toThrow(
      refused(
        'ERR_RATE_LIMIT_ROUTE_NUMBERS_REQUIRED',
        'BucketService.peekRoute("shared"): the routes that share this policy name have different numbers ' +
          '(capacity 3, refillPerSecond 0.001; capacity 5, refillPerSecond 0.001); pass them: ' +
          'peekRoute("shared", who, { capacity, refillPerSecond })',
      ),
    );
    expect(await buckets.peekRoute('shared', { ip: '203.0.113.30' }, { capacity: 3, refillPerSecond: 0.001 })).toEqual({
      allowed: true,
      limit: 3,
      remaining: 3,
      retryAfterSeconds: 0,
      resetSeconds: 0,
    });
    await expect(buckets.peekRoute('dynamic', { ip: '203.0.113.30' })).rejects.toThrow(
      'BucketService.peekRoute("dynamic"): the numbers of this policy are computed per request (functions or resolve); pass them',
    );
    expect(await buckets.peekRoute('dynamic', { ip: '203.0.113.30' }, { capacity: 4, refillPerSecond: 0.001, cost: 2 })).toMatchObject({
      allowed: true,
      limit: 4,
      remaining: 4,
    });
    await expect(buckets.peekRoute('dynamic', { ip: '203.0.113.30' }, { capacity: 0, refillPerSecond: 1 })).rejects.toThrow(
      'BucketService capacity must be an integer >= 1 (got 0) on BucketService.peekRoute("dynamic")',
    );
    // Peeking never writes a bucket.
    expect(await client.exists(key('ip:203.0.113.30', 'shared'), key('ip:203.0.113.30', 'dynamic'))).toBe(0);
  });
});

describe.each(['open', 'closed', 'local'] as const)("route buckets while Redis is down (failureMode '%s')", (failureMode) => {
  let server: RedisServer;
  let app: INestApplication;
  let buckets: BucketService;

  beforeAll(async () => {
    server = await RedisServer.start();
    app = await createApp(routeBucketsModule(server.url, 'rl:', { failureMode }), 'express');
    buckets = app.get(BucketService);
    expect(await buckets.peekRoute(IP_SCOPE, { ip: '203.0.113.40' })).toMatchObject({ allowed: true, remaining: 2 });
    await server.stop('SIGKILL');
  });

  afterAll(async () => {
    await app?.close();
    await server?.stop();
  });

  async function rejection(call: () => Promise<unknown>): Promise<unknown> {
    return call().then(
      (value) => ({ resolved: value }),
      (error: unknown) => error,
    );
  }

  it.each([
    ['resetRoute', () => buckets.resetRoute(IP_SCOPE, { ip: '203.0.113.40' })],
    ['reset', () => buckets.reset('some-bucket')],
  ])('%s() rejects with RateLimitUnavailableError (the store’s error as its cause): nothing was reset', async (_name, call) => {
    const error = await rejection(call);
    expect(error).toBeInstanceOf(RateLimitUnavailableError);
    expect((error as RateLimitUnavailableError).getStatus()).toBe(503);
    expect((error as Error).cause).toBeInstanceOf(Error);
  });

  it('peekRoute() fails like peek()', async () => {
    const peeked = rejection(() => buckets.peekRoute(IP_SCOPE, { ip: '203.0.113.40' }));
    if (failureMode === 'closed') {
      expect(await peeked).toBeInstanceOf(RateLimitUnavailableError);
    } else if (failureMode === 'open') {
      // As peek() in 'open' mode: what a request would leave in a full bucket.
      expect(await peeked).toEqual({ resolved: { allowed: true, limit: 2, remaining: 1, retryAfterSeconds: 0, resetSeconds: WAIT } });
    } else {
      // The in-process bucket, full.
      expect(await peeked).toEqual({ resolved: { allowed: true, limit: 2, remaining: 2, retryAfterSeconds: 0, resetSeconds: 0 } });
    }
  });

  if (failureMode === 'local') {
    it('still forgets the in-process bucket, so this instance lets the client in again', async () => {
      const ip = () => request(app.getHttpServer()).get('/buckets/ip');
      expect([(await ip()).status, (await ip()).status, (await ip()).status]).toEqual([200, 200, 429]);
      // Supertest comes from ::ffff:127.0.0.1 (Express), the limiter's ip:127.0.0.1.
      expect(await rejection(() => buckets.resetRoute(IP_SCOPE, { ip: '127.0.0.1' }))).toBeInstanceOf(RateLimitUnavailableError);
      await ip().expect(200);
    });
  }
});

describe('a BucketService built by hand', () => {
  it('knows no routes, and says why instead of guessing a key', async () => {
    const buckets = new BucketService(new MemoryBucketStore(), resolveOptions({ store: 'memory' }));
    await expect(buckets.resetRoute('login', { ip: '1.2.3.4' })).rejects.toThrow(
      refused(
        'ERR_RATE_LIMIT_UNKNOWN_SCOPE',
        'BucketService.resetRoute("login"): this BucketService knows no routes (it was not created by RateLimitModule)',
      ),
    );
    await expect(buckets.peekRoute('login', { ip: '1.2.3.4' }, { capacity: 2, refillPerSecond: 1 })).rejects.toThrow('knows no routes');
  });
});
