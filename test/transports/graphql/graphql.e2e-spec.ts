import { createHash } from 'node:crypto';
import { type DynamicModule, type INestApplication, Module } from '@nestjs/common';
import { ApolloDriver, type ApolloDriverConfig } from '@nestjs/apollo';
import { GraphQLModule } from '@nestjs/graphql';
import { MercuriusDriver, type MercuriusDriverConfig } from '@nestjs/mercurius';
import { Redis } from 'ioredis';
import request from 'supertest';
import { RateLimitModule, type RateLimitModuleOptions } from 'nest-redis-rate-limit';
import { createApp, type Platform } from '../../support/app.js';
import { deleteKeys, keysUnder, RedisServer, redisUrl, testPrefix } from '../../support/redis.js';
import { ClassLimitedResolver, IdentityResolver, LimitedResolver, PER_MINUTE } from './graphql.resolvers.js';

/** The two GraphQL servers Nest ships a driver for, each on the HTTP platform it runs on. */
const SERVERS = [
  {
    name: 'Apollo over Express',
    platform: 'express' as Platform,
    graphql: () => apollo(),
    thrown: { extensions: { code: 'INTERNAL_SERVER_ERROR' } },
  },
  // Mercurius gives an error a resolver threw no extensions at all.
  { name: 'Mercurius over Fastify', platform: 'fastify' as Platform, graphql: () => mercurius(), thrown: {} },
];

const apollo = (): DynamicModule => GraphQLModule.forRoot<ApolloDriverConfig>({ driver: ApolloDriver, autoSchemaFile: true });
const mercurius = (): DynamicModule => GraphQLModule.forRoot<MercuriusDriverConfig>({ driver: MercuriusDriver, autoSchemaFile: true });

/** The digest the README documents for an API key without `keys.secret`: SHA-256, 32 hex digits. */
const sha = (value: string) => createHash('sha256').update(value).digest('hex').slice(0, 32);

/** A GraphQL POST as a client sends it, over a real socket. */
function post(app: INestApplication, query: string, headers: Record<string, string> = {}) {
  const req = request(app.getHttpServer()).post('/graphql').set('content-type', 'application/json');
  for (const [name, value] of Object.entries(headers)) req.set(name, value);
  return req.send({ query });
}

async function startApp(
  graphql: () => DynamicModule,
  platform: Platform,
  options: RateLimitModuleOptions,
  resolvers: Function[] = [LimitedResolver, ClassLimitedResolver, IdentityResolver],
): Promise<INestApplication> {
  @Module({ imports: [RateLimitModule.forRoot(options), graphql()], providers: resolvers as any[] })
  class GraphQLAppModule {}
  // Trusting X-Forwarded-For lets one test client speak for several addresses (keyBy 'ip').
  const app = await createApp(GraphQLAppModule, platform, undefined, { trustProxy: true });
  await app.listen(0, '127.0.0.1');
  return app;
}

const RATE_LIMITED = { code: 'RATE_LIMITED', retryAfter: expect.any(Number) };

describe.each(SERVERS)('@RateLimit on GraphQL resolvers, $name', ({ platform, graphql, thrown }) => {
  const prefix = testPrefix(`graphql-${platform}`);
  let client: Redis;
  let app: INestApplication;

  beforeAll(async () => {
    client = new Redis(await redisUrl());
    app = await startApp(graphql, platform, { redis: await redisUrl(), keyPrefix: prefix });
  });

  afterAll(async () => {
    await app?.close();
    await deleteKeys(client, prefix);
    await client.quit();
  });

  it('allows exactly 3 of 10 parallel POSTs of a query; the others get HTTP 200, the field null and RATE_LIMITED', async () => {
    const answers = await Promise.all(Array.from({ length: 10 }, () => post(app, '{ burst }')));
    expect(answers.map((a) => a.status)).toEqual(Array(10).fill(200));
    const allowed = answers.filter((a) => a.body.data?.burst === 'burst');
    const refused = answers.filter((a) => a.body.data?.burst === null);
    expect(allowed).toHaveLength(3);
    expect(refused).toHaveLength(7);
    for (const a of allowed) expect(a.body.errors).toBeUndefined();
    for (const a of refused) {
      expect(a.body.data).toEqual({ burst: null });
      expect(a.body.errors).toHaveLength(1);
      expect(a.body.errors[0]).toMatchObject({ message: 'Too Many Requests', path: ['burst'], extensions: RATE_LIMITED });
      const { retryAfter } = a.body.errors[0].extensions;
      expect(Number.isInteger(retryAfter)).toBe(true);
      // One token a minute, none left: the next is a minute away (less the few ms since the first take).
      expect(retryAfter).toBe(60);
    }

    // Headers on the HTTP response, as on a route (README "Headers"): B = 3, R = 1/60, W = 180.
    expect(allowed.map((a) => a.headers['x-ratelimit-remaining']).sort()).toEqual(['0', '1', '2']);
    for (const a of allowed) {
      const remaining = Number(a.headers['x-ratelimit-remaining']);
      expect(a.headers).toMatchObject({
        'x-ratelimit-limit': '3',
        'x-ratelimit-reset': String((3 - remaining) * 60),
        'ratelimit-limit': '3',
        'ratelimit-remaining': String(remaining),
        'ratelimit-reset': String((3 - remaining) * 60),
        'ratelimit-policy': '3;w=180',
      });
      expect(a.headers['retry-after']).toBeUndefined();
    }
    for (const a of refused) {
      expect(a.headers).toMatchObject({
        'x-ratelimit-limit': '3',
        'x-ratelimit-remaining': '0',
        'x-ratelimit-reset': '180',
        'ratelimit-limit': '3',
        'ratelimit-remaining': '0',
        'ratelimit-reset': '180',
        'ratelimit-policy': '3;w=180',
        'retry-after': '60',
      });
    }
    expect(await client.exists(`${prefix}{ip:127.0.0.1}:LimitedResolver.burst`)).toBe(1);
  });

  it('limits a mutation: 2 allowed, then RATE_LIMITED, and a refused mutation never runs', async () => {
    const first = await post(app, 'mutation { bump }').expect(200);
    const second = await post(app, 'mutation { bump }').expect(200);
    const third = await post(app, 'mutation { bump }').expect(200);
    expect(first.body).toEqual({ data: { bump: 1 } });
    expect(second.body).toEqual({ data: { bump: 2 } });
    expect(third.body.data).toEqual({ bump: null });
    expect(third.body.errors[0]).toMatchObject({ path: ['bump'], extensions: { code: 'RATE_LIMITED', retryAfter: 60 } });
    expect(third.headers).toMatchObject({ 'x-ratelimit-limit': '2', 'x-ratelimit-remaining': '0', 'retry-after': '60' });
    expect(await client.exists(`${prefix}{ip:127.0.0.1}:LimitedResolver.bump`)).toBe(1);
  });

  it('applies a class-level policy to every query of the resolver, each with its own bucket; @SkipRateLimit exempts', async () => {
    for (const field of ['classA', 'classB']) {
      await post(app, `{ ${field} }`).expect(200);
      await post(app, `{ ${field} }`).expect(200);
      const refused = await post(app, `{ ${field} }`).expect(200);
      expect(refused.body.data).toEqual({ [field]: null });
      expect(refused.body.errors[0]).toMatchObject({ path: [field], extensions: RATE_LIMITED });
      expect(await client.exists(`${prefix}{ip:127.0.0.1}:ClassLimitedResolver.${field}`)).toBe(1);
    }
    for (let i = 0; i < 4; i++) {
      const free = await post(app, '{ classFree }').expect(200);
      expect(free.body).toEqual({ data: { classFree: 'free' } });
      expect(free.headers['x-ratelimit-limit']).toBeUndefined();
    }
    expect(await keysUnder(client, `${prefix}{ip:127.0.0.1}:ClassLimitedResolver.classFree`)).toEqual([]);
  });

  it('charges a resolver its cost: cost 2 on capacity 5 allows 2 calls, remaining 3 then 1', async () => {
    const first = await post(app, '{ costly }').expect(200);
    const second = await post(app, '{ costly }').expect(200);
    const third = await post(app, '{ costly }').expect(200);
    expect(first.body).toEqual({ data: { costly: 'costly' } });
    expect(second.body).toEqual({ data: { costly: 'costly' } });
    expect(first.headers['x-ratelimit-remaining']).toBe('3');
    expect(second.headers['x-ratelimit-remaining']).toBe('1');
    expect(third.body.data).toEqual({ costly: null });
    // One token left, a cost of 2: the missing token is a minute away.
    expect(third.body.errors[0]).toMatchObject({ path: ['costly'], extensions: { code: 'RATE_LIMITED', retryAfter: 60 } });
    expect(third.headers).toMatchObject({ 'x-ratelimit-remaining': '1', 'retry-after': '60' });
  });

  it('decides each root field of one operation on its own: one refused, the other answered', async () => {
    const first = await post(app, '{ pairA pairB }').expect(200);
    expect(first.body).toEqual({ data: { pairA: 'a', pairB: 'b' } });
    const second = await post(app, '{ pairA pairB }').expect(200);
    expect(second.body.data).toEqual({ pairA: null, pairB: 'b' });
    expect(second.body.errors).toHaveLength(1);
    expect(second.body.errors[0]).toMatchObject({ path: ['pairA'], extensions: RATE_LIMITED });
    // pairB spent a token per operation, pairA only on the first.
    await post(app, '{ pairB }').expect(200);
    const third = await post(app, '{ pairB }').expect(200);
    expect(third.body.errors[0]).toMatchObject({ path: ['pairB'], extensions: RATE_LIMITED });
  });

  it('decides each alias of one field as a call of its own: 4 aliases on capacity 3, exactly one refused', async () => {
    const answer = await post(app, '{ a: aliased b: aliased c: aliased d: aliased }').expect(200);
    const values = Object.values(answer.body.data);
    expect(values.filter((v) => v === 'aliased')).toHaveLength(3);
    expect(values.filter((v) => v === null)).toHaveLength(1);
    expect(answer.body.errors).toHaveLength(1);
    expect(answer.body.errors[0]).toMatchObject({ extensions: RATE_LIMITED });
    const refusedAlias = Object.keys(answer.body.data).find((alias) => answer.body.data[alias] === null);
    expect(answer.body.errors[0].path).toEqual([refusedAlias]);
  });

  it('refunds by outcome: refundOn failure gives the token back when the resolver throws, refundOn success when it returns', async () => {
    // refundOn 'failure', capacity 1: failures cost nothing, the first success spends the only token.
    for (let i = 0; i < 3; i++) {
      const failed = await post(app, '{ refundedOnFailure(fail: true) }').expect(200);
      // The resolver's own error, exactly: not a refusal (no RATE_LIMITED code), nothing added.
      expect(failed.body).toEqual({
        data: { refundedOnFailure: null },
        errors: [{ message: 'the resolver failed', locations: [{ line: 1, column: 3 }], path: ['refundedOnFailure'], ...thrown }],
      });
    }
    expect((await post(app, '{ refundedOnFailure(fail: false) }').expect(200)).body).toEqual({ data: { refundedOnFailure: 'ok' } });
    const spent = await post(app, '{ refundedOnFailure(fail: false) }').expect(200);
    expect(spent.body.errors[0]).toMatchObject({ extensions: RATE_LIMITED });

    // refundOn 'success', capacity 1: successes cost nothing, the first failure spends the only token.
    for (let i = 0; i < 3; i++) {
      expect((await post(app, '{ refundedOnSuccess(fail: false) }').expect(200)).body).toEqual({ data: { refundedOnSuccess: 'ok' } });
    }
    const failed = await post(app, '{ refundedOnSuccess(fail: true) }').expect(200);
    expect(failed.body).toEqual({
      data: { refundedOnSuccess: null },
      errors: [{ message: 'the resolver failed', locations: [{ line: 1, column: 3 }], path: ['refundedOnSuccess'], ...thrown }],
    });
    const refused = await post(app, '{ refundedOnSuccess(fail: false) }').expect(200);
    expect(refused.body.errors[0]).toMatchObject({ path: ['refundedOnSuccess'], extensions: RATE_LIMITED });
  });

  describe('identity from the HTTP request in the GraphQL context', () => {
    it("keyBy 'ip': one bucket per client address", async () => {
      const from = (ip: string) => ({ 'x-forwarded-for': ip });
      await post(app, '{ byIp }', from('203.0.113.7')).expect(200);
      await post(app, '{ byIp }', from('203.0.113.7')).expect(200);
      const refused = await post(app, '{ byIp }', from('203.0.113.7')).expect(200);
      expect(refused.body.errors[0]).toMatchObject({ path: ['byIp'], extensions: RATE_LIMITED });
      const other = await post(app, '{ byIp }', from('198.51.100.9')).expect(200);
      expect(other.body).toEqual({ data: { byIp: 'ip' } });
      expect(other.headers['x-ratelimit-remaining']).toBe('1');
      const keys = await keysUnder(client, prefix);
      expect(keys).toContain(`${prefix}{ip:203.0.113.7}:IdentityResolver.byIp`);
      expect(keys).toContain(`${prefix}{ip:198.51.100.9}:IdentityResolver.byIp`);
    });

    it("keyBy 'user': req.user set by a guard on the resolver; without a user, the IP bucket", async () => {
      const as = (user: string) => ({ 'x-user': user });
      await post(app, '{ byUser }', as('alice')).expect(200);
      await post(app, '{ byUser }', as('alice')).expect(200);
      const refused = await post(app, '{ byUser }', as('alice')).expect(200);
      expect(refused.body.errors[0]).toMatchObject({ path: ['byUser'], extensions: RATE_LIMITED });
      const bob = await post(app, '{ byUser }', as('bob')).expect(200);
      expect(bob.body).toEqual({ data: { byUser: 'user' } });
      expect(bob.headers['x-ratelimit-remaining']).toBe('1');
      expect((await post(app, '{ byUser }').expect(200)).body).toEqual({ data: { byUser: 'user' } });
      const keys = await keysUnder(client, prefix);
      expect(keys).toContain(`${prefix}{user:alice}:IdentityResolver.byUser`);
      expect(keys).toContain(`${prefix}{user:bob}:IdentityResolver.byUser`);
      expect(keys).toContain(`${prefix}{ip:127.0.0.1}:IdentityResolver.byUser`);
    });

    it("keyBy 'apiKey': one bucket per x-api-key header, stored as a digest", async () => {
      const key = (value: string) => ({ 'x-api-key': value });
      await post(app, '{ byApiKey }', key('gql-key-alpha')).expect(200);
      await post(app, '{ byApiKey }', key('gql-key-alpha')).expect(200);
      const refused = await post(app, '{ byApiKey }', key('gql-key-alpha')).expect(200);
      expect(refused.body.errors[0]).toMatchObject({ path: ['byApiKey'], extensions: RATE_LIMITED });
      const beta = await post(app, '{ byApiKey }', key('gql-key-beta')).expect(200);
      expect(beta.body).toEqual({ data: { byApiKey: 'apiKey' } });
      expect(beta.headers['x-ratelimit-remaining']).toBe('1');
      const keys = await keysUnder(client, prefix);
      expect(keys).toContain(`${prefix}{key:${sha('gql-key-alpha')}}:IdentityResolver.byApiKey`);
      expect(keys).toContain(`${prefix}{key:${sha('gql-key-beta')}}:IdentityResolver.byApiKey`);
      expect(keys.join('\n')).not.toContain('gql-key-');
    });

    it('a keyBy function: one bucket per value it returns', async () => {
      const tenant = (value: string) => ({ 'x-tenant': value });
      await post(app, '{ byTenant }', tenant('acme')).expect(200);
      await post(app, '{ byTenant }', tenant('acme')).expect(200);
      const refused = await post(app, '{ byTenant }', tenant('acme')).expect(200);
      expect(refused.body.errors[0]).toMatchObject({ path: ['byTenant'], extensions: RATE_LIMITED });
      const globex = await post(app, '{ byTenant }', tenant('globex')).expect(200);
      expect(globex.body).toEqual({ data: { byTenant: 'tenant' } });
      const keys = await keysUnder(client, prefix);
      expect(keys).toContain(`${prefix}{id:acme}:IdentityResolver.byTenant`);
      expect(keys).toContain(`${prefix}{id:globex}:IdentityResolver.byTenant`);
    });
  });

  it('applies the module defaults to a resolver without @RateLimit; @SkipRateLimit still exempts', async () => {
    const defaultsPrefix = `${prefix}defaults:`;
    const defaultsApp = await startApp(
      graphql,
      platform,
      { redis: await redisUrl(), keyPrefix: defaultsPrefix, defaults: { capacity: 2, refillPerSecond: PER_MINUTE } },
      [LimitedResolver, ClassLimitedResolver],
    );
    try {
      const first = await post(defaultsApp, '{ unlimited }').expect(200);
      expect(first.body).toEqual({ data: { unlimited: 'free' } });
      expect(first.headers).toMatchObject({ 'x-ratelimit-limit': '2', 'x-ratelimit-remaining': '1' });
      await post(defaultsApp, '{ unlimited }').expect(200);
      const refused = await post(defaultsApp, '{ unlimited }').expect(200);
      expect(refused.body.data).toEqual({ unlimited: null });
      expect(refused.body.errors[0]).toMatchObject({ path: ['unlimited'], extensions: { code: 'RATE_LIMITED', retryAfter: 60 } });
      expect(await client.exists(`${defaultsPrefix}{ip:127.0.0.1}:LimitedResolver.unlimited`)).toBe(1);
      for (let i = 0; i < 3; i++) {
        expect((await post(defaultsApp, '{ classFree }').expect(200)).body).toEqual({ data: { classFree: 'free' } });
      }
    } finally {
      await defaultsApp.close();
    }
  });

  it("failureMode 'closed' with Redis stopped: the field errors with RATE_LIMIT_UNAVAILABLE, unlimited fields still answer", async () => {
    const server = await RedisServer.start();
    let closedApp: INestApplication | undefined;
    try {
      closedApp = await startApp(graphql, platform, { redis: server.url, failureMode: 'closed', timeoutMs: 100 }, [LimitedResolver]);
      expect((await post(closedApp, '{ burst }').expect(200)).body).toEqual({ data: { burst: 'burst' } });
      await server.stop();
      const answer = await post(closedApp, '{ burst unlimited }').expect(200);
      expect(answer.body.data).toEqual({ burst: null, unlimited: 'free' });
      expect(answer.body.errors).toHaveLength(1);
      expect(answer.body.errors[0]).toMatchObject({
        path: ['burst'],
        extensions: { code: 'RATE_LIMIT_UNAVAILABLE', retryAfter: 1 },
      });
      expect(answer.headers['retry-after']).toBe('1');
    } finally {
      await closedApp?.close();
      await server.stop();
    }
  });
});
