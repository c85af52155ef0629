import type { IncomingMessage } from 'node:http';
import { type INestApplication, Module } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { WsAdapter } from '@nestjs/platform-ws';
import { MessageBody, type OnGatewayConnection, SubscribeMessage, WebSocketGateway, WsException } from '@nestjs/websockets';
import { Redis } from 'ioredis';
import { RateLimit, RateLimitModule, type RateLimitModuleOptions, SkipRateLimit } from 'nest-redis-rate-limit';
import { deleteKeys, keysUnder, RedisServer, redisUrl, testPrefix, tokensOf } from '../../support/redis.js';
import { closeAll, expectWholeSeconds, RATE_LIMITED, sha, UNAVAILABLE, until, type WsClient, wsClient } from './clients.js';

/**
 * Issue 13 item 2 on ws (WsAdapter of @nestjs/platform-ws, the `ws` client), against the shared Redis:
 * @RateLimit on @SubscribeMessage handlers, the identity from the TCP peer (ws keeps no handshake
 * request), `client.user` set by the gateway, a keyBy function of the message; the refusal as an
 * `{ event: 'exception', data }` message.
 */
const calls: Record<string, number> = {};
const count = (name: string) => (calls[name] = (calls[name] ?? 0) + 1);

@WebSocketGateway({ path: '/main' })
class WsGateway implements OnGatewayConnection {
  /** ws has no middleware: the gateway reads the upgrade request and sets `client.user`, as an auth step would. */
  handleConnection(client: { user?: { id: string } }, request: IncomingMessage) {
    const id = request.headers['x-user-id'];
    if (typeof id === 'string') client.user = { id };
  }

  @SubscribeMessage('burst')
  @RateLimit(3, 0.01)
  burst(@MessageBody() n: number) {
    count('burst');
    return { event: 'burst:ok', data: n };
  }

  @SubscribeMessage('byIp')
  @RateLimit(2, 0.01)
  byIp() {
    return { event: 'ok', data: 'byIp' };
  }

  @SubscribeMessage('byKey')
  @RateLimit(2, 0.01, 'apiKey')
  byKey() {
    return { event: 'ok', data: 'byKey' };
  }

  @SubscribeMessage('byUser')
  @RateLimit(2, 0.01, 'user')
  byUser() {
    return { event: 'ok', data: 'byUser' };
  }

  @SubscribeMessage('byRoom')
  @RateLimit(2, 0.01, (ctx) => ctx.switchToWs().getData().room)
  byRoom(@MessageBody() body: { room: string }) {
    return { event: 'ok', data: body.room };
  }

  @SubscribeMessage('refund')
  @RateLimit({ capacity: 2, refillPerSecond: 0.01, refundOn: 'failure' })
  refund(@MessageBody() body: { fail: boolean }) {
    count('refund');
    if (body.fail) throw new WsException({ status: 'error', code: 'HANDLER_FAILED', message: 'failed on purpose' });
    return { event: 'ok', data: 'refund' };
  }
}

@WebSocketGateway({ path: '/class' })
@RateLimit(2, 0.01)
class WsClassGateway {
  @SubscribeMessage('a')
  a() {
    return { event: 'ok', data: 'a' };
  }

  @SubscribeMessage('b')
  b() {
    return { event: 'ok', data: 'b' };
  }

  @SubscribeMessage('free')
  @SkipRateLimit()
  free() {
    return { event: 'ok', data: 'free' };
  }
}

/** The way round it: the gateway keeps the upgrade's key on the client, and `keys.apiKey` reads it from the view's `client`. */
@WebSocketGateway({ path: '/keys' })
class WsKeyGateway implements OnGatewayConnection {
  handleConnection(client: { apiKey?: string }, request: IncomingMessage) {
    const key = request.headers['x-api-key'];
    if (typeof key === 'string') client.apiKey = key;
  }

  @SubscribeMessage('byKey')
  @RateLimit(2, 0.01, 'apiKey')
  byKey() {
    return { event: 'ok', data: 'byKey' };
  }
}

@WebSocketGateway({ path: '/closed' })
class WsClosedGateway {
  @SubscribeMessage('ping')
  @RateLimit(5, 0.01)
  ping() {
    return { event: 'pong', data: 1 };
  }
}

async function startApp(options: RateLimitModuleOptions, gateways: Function[]): Promise<INestApplication> {
  @Module({ imports: [RateLimitModule.forRoot(options)], providers: gateways as any[] })
  class WsAppModule {}
  const moduleRef = await Test.createTestingModule({ imports: [WsAppModule] }).compile();
  const app = moduleRef.createNestApplication({ logger: false });
  app.useWebSocketAdapter(new WsAdapter(app));
  await app.listen(0, '127.0.0.1');
  return app;
}

/** Sends `n` messages at once on `client` and waits for `n` answers (handler replies and exceptions). */
async function send(client: WsClient, event: string, data: (i: number) => unknown, n: number): Promise<{ ok: any[]; refused: any[] }> {
  const before = client.messages.length;
  for (let i = 0; i < n; i++) client.send(event, data(i));
  await until(() => client.messages.length - before, n, `answers to ${event}`);
  const answers = client.messages.slice(before);
  return {
    ok: answers.filter((m) => m.event !== 'exception').map((m) => m.data),
    refused: answers.filter((m) => m.event === 'exception').map((m) => m.data),
  };
}

describe('@RateLimit on ws gateways', () => {
  const prefix = testPrefix('websockets-ws');
  let redis: Redis;
  let app: INestApplication;
  let base: string;
  const clients: WsClient[] = [];
  const connect = (path = '/main', options = {}) => wsClient(base + path, options, clients);

  beforeAll(async () => {
    redis = new Redis(await redisUrl());
    app = await startApp({ redis: await redisUrl(), keyPrefix: prefix }, [WsGateway, WsClassGateway]);
    base = (await app.getUrl()).replace(/^http/, 'ws');
  });

  afterAll(async () => {
    await closeAll([], clients);
    await app?.close();
    await deleteKeys(redis, prefix);
    await redis.quit();
  });

  it('10 messages at once from two connections of one address: exactly 3 handled, 7 `exception` messages with the payload', async () => {
    const [one, two] = [await connect(), await connect()];
    for (let i = 0; i < 10; i++) (i % 2 ? two : one).send('burst', i);
    const all = () => [...one.messages, ...two.messages];
    await until(() => all().length, 10, 'answers');
    expect(calls.burst).toBe(3);
    expect(all().filter((m) => m.event === 'burst:ok')).toHaveLength(3);
    const refusals = all().filter((m) => m.event === 'exception');
    expect(refusals).toHaveLength(7);
    for (const m of refusals) {
      expect(m).toEqual({ event: 'exception', data: RATE_LIMITED });
      expectWholeSeconds(m.data);
    }
    expect(await tokensOf(redis, `${prefix}{ip:127.0.0.1}:WsGateway.burst`)).toBeLessThan(0.01);
  });

  it('per IP (default, the TCP peer): 127.0.0.1 and 127.0.0.2 each get their own bucket {ip:<address>}', async () => {
    const local = await connect();
    const other = await connect('/main', { localAddress: '127.0.0.2' });
    const [a, b] = await Promise.all([send(local, 'byIp', () => 0, 3), send(other, 'byIp', () => 0, 3)]);
    for (const answers of [a, b]) {
      expect(answers.ok).toEqual(['byIp', 'byIp']);
      expect(answers.refused).toEqual([RATE_LIMITED]);
    }
    const keys = (await keysUnder(redis, prefix)).filter((k) => k.endsWith(':WsGateway.byIp'));
    expect(keys).toEqual([`${prefix}{ip:127.0.0.1}:WsGateway.byIp`, `${prefix}{ip:127.0.0.2}:WsGateway.byIp`]);
  });

  it("keyBy 'apiKey': ws keeps no handshake headers, so an x-api-key sent on the upgrade falls back to the IP bucket (documented)", async () => {
    const k1 = await connect('/main', { headers: { 'x-api-key': 'alpha-key' } });
    const k2 = await connect('/main', { headers: { 'x-api-key': 'beta-key' } });
    const [a, b] = await Promise.all([send(k1, 'byKey', () => 0, 2), send(k2, 'byKey', () => 0, 2)]);
    // One bucket for both keys: the address's.
    expect([...a.ok, ...b.ok]).toEqual(['byKey', 'byKey']);
    expect([...a.refused, ...b.refused]).toEqual([RATE_LIMITED, RATE_LIMITED]);
    const keys = (await keysUnder(redis, prefix)).filter((k) => k.endsWith(':WsGateway.byKey'));
    // Exactly the address's bucket (no {key:...} one), drained by the two messages allowed between both
    // keys (what 0.01/s refilled since stays below 0.1 for 10 s).
    expect(keys).toEqual([`${prefix}{ip:127.0.0.1}:WsGateway.byKey`]);
    expect(await tokensOf(redis, keys[0])).toBeLessThan(0.1);
  });

  it("keyBy 'apiKey' with keys.apiKey reading a key the gateway kept on the client: one bucket {key:<sha256>} per key", async () => {
    const own: WsClient[] = [];
    let keyApp: INestApplication | undefined;
    try {
      keyApp = await startApp({ redis: await redisUrl(), keyPrefix: prefix, keys: { apiKey: (request) => request.client?.apiKey } }, [
        WsKeyGateway,
      ]);
      const url = (await keyApp.getUrl()).replace(/^http/, 'ws') + '/keys';
      const k1 = await wsClient(url, { headers: { 'x-api-key': 'alpha-key' } }, own);
      const k2 = await wsClient(url, { headers: { 'x-api-key': 'beta-key' } }, own);
      const answers = await Promise.all([send(k1, 'byKey', () => 0, 3), send(k2, 'byKey', () => 0, 3)]);
      for (const answer of answers) expect(answer).toEqual({ ok: ['byKey', 'byKey'], refused: [RATE_LIMITED] });
      const keys = (await keysUnder(redis, prefix)).filter((k) => k.endsWith(':WsKeyGateway.byKey'));
      expect(keys).toEqual(
        [`${prefix}{key:${sha('alpha-key')}}:WsKeyGateway.byKey`, `${prefix}{key:${sha('beta-key')}}:WsKeyGateway.byKey`].sort(),
      );
    } finally {
      await closeAll([], own);
      await keyApp?.close();
    }
  });

  it("keyBy 'user': client.user set by the gateway from the upgrade request, bucket {user:<id>}; without one, the IP's", async () => {
    const alice = await connect('/main', { headers: { 'x-user-id': 'alice' } });
    const bob = await connect('/main', { headers: { 'x-user-id': 'bob' } });
    const nobody = await connect();
    const answers = await Promise.all([alice, bob, nobody].map((c) => send(c, 'byUser', () => 0, 3)));
    for (const { ok, refused } of answers) {
      expect(ok).toEqual(['byUser', 'byUser']);
      expect(refused).toEqual([RATE_LIMITED]);
    }
    const keys = (await keysUnder(redis, prefix)).filter((k) => k.endsWith(':WsGateway.byUser'));
    expect(keys).toEqual(
      [`${prefix}{user:alice}:WsGateway.byUser`, `${prefix}{user:bob}:WsGateway.byUser`, `${prefix}{ip:127.0.0.1}:WsGateway.byUser`].sort(),
    );
  });

  it('a keyBy function reading the message: (ctx) => ctx.switchToWs().getData().room, bucket {id:<room>}', async () => {
    const client = await connect();
    const { ok, refused } = await send(client, 'byRoom', (i) => ({ room: i % 2 ? 'games' : 'lobby' }), 6);
    expect(ok.sort()).toEqual(['games', 'games', 'lobby', 'lobby']);
    expect(refused).toEqual([RATE_LIMITED, RATE_LIMITED]);
    const keys = (await keysUnder(redis, prefix)).filter((k) => k.endsWith(':WsGateway.byRoom'));
    expect(keys).toEqual([`${prefix}{id:games}:WsGateway.byRoom`, `${prefix}{id:lobby}:WsGateway.byRoom`]);
  });

  it('a class-level @RateLimit limits each handler in its own bucket; @SkipRateLimit() exempts one', async () => {
    const client = await connect('/class');
    const a = await send(client, 'a', () => 0, 3);
    const b = await send(client, 'b', () => 0, 3);
    const free = await send(client, 'free', () => 0, 6);
    expect(a).toEqual({ ok: ['a', 'a'], refused: [RATE_LIMITED] });
    expect(b).toEqual({ ok: ['b', 'b'], refused: [RATE_LIMITED] });
    expect(free).toEqual({ ok: Array(6).fill('free'), refused: [] });
    expect((await keysUnder(redis, prefix)).filter((k) => k.includes('WsClassGateway'))).toEqual([
      `${prefix}{ip:127.0.0.1}:WsClassGateway.a`,
      `${prefix}{ip:127.0.0.1}:WsClassGateway.b`,
    ]);
  });

  it("refundOn: 'failure': a handler that throws a WsException gives its token back", async () => {
    const client = await connect();
    const key = `${prefix}{ip:127.0.0.1}:WsGateway.refund`;
    for (let i = 0; i < 5; i++) {
      const answer = await send(client, 'refund', () => ({ fail: true }), 1);
      expect(answer).toEqual({ ok: [], refused: [{ status: 'error', code: 'HANDLER_FAILED', message: 'failed on purpose' }] });
    }
    expect(calls.refund).toBe(5);
    expect(await tokensOf(redis, key)).toBeCloseTo(2, 2);
    const after = await send(client, 'refund', () => ({ fail: false }), 3);
    expect(after).toEqual({ ok: ['refund', 'refund'], refused: [RATE_LIMITED] });
    expect(calls.refund).toBe(7);
    expect(await tokensOf(redis, key)).toBeLessThan(0.01);
  });

  it("failureMode 'closed' with its Redis stopped: an `exception` message with RATE_LIMIT_UNAVAILABLE", async () => {
    const server = await RedisServer.start();
    const own: WsClient[] = [];
    let closedApp: INestApplication | undefined;
    try {
      closedApp = await startApp({ redis: server.url, failureMode: 'closed', timeoutMs: 100 }, [WsClosedGateway]);
      const client = await wsClient((await closedApp.getUrl()).replace(/^http/, 'ws') + '/closed', {}, own);
      expect(await send(client, 'ping', () => 0, 1)).toEqual({ ok: [1], refused: [] });
      await server.stop();
      const answer = await send(client, 'ping', () => 0, 1);
      expect(answer).toEqual({ ok: [], refused: [UNAVAILABLE] });
      expectWholeSeconds(answer.refused[0]);
    } finally {
      await closeAll([], own);
      await closedApp?.close();
      await server.stop();
    }
  });
});
