import { readFileSync } from 'node:fs';
import { type CanActivate, type ExecutionContext, type INestApplication, Injectable, Module, UseGuards } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { IoAdapter } from '@nestjs/platform-socket.io';
import { MessageBody, type OnGatewayInit, SubscribeMessage, WebSocketGateway, WsException } from '@nestjs/websockets';
import { Redis } from 'ioredis';
import { RateLimit, RateLimitModule, type RateLimitModuleOptions, SkipRateLimit } from 'nest-redis-rate-limit';
import { deleteKeys, keysUnder, RedisServer, redisUrl, testPrefix, tokensOf } from '../../support/redis.js';
import { closeAll, expectWholeSeconds, type IoClient, ioClient, type IoOptions, RATE_LIMITED, sha, UNAVAILABLE, until } from './clients.js';

/**
 * Issue 13 item 2 on socket.io (IoAdapter, socket.io-client), against the shared Redis: @RateLimit on
 * @SubscribeMessage handlers, the identity from the handshake (address, headers, auth), the refusal as
 * a WsException payload on the `exception` event and on the acknowledgement.
 */
const calls: Record<string, number> = {};
const count = (name: string) => (calls[name] = (calls[name] ?? 0) + 1);

/** Sets `client.user` (the fallback of `client.data.user`) from the handshake's auth, as an auth guard would. */
@Injectable()
class HandshakeUserGuard implements CanActivate {
  canActivate(context: ExecutionContext): boolean {
    const client = context.switchToWs().getClient();
    const id = client.handshake?.auth?.guardUser;
    if (typeof id === 'string') client.user = { id };
    return true;
  }
}

@WebSocketGateway()
class IoGateway implements OnGatewayInit {
  /** socket.io middleware: what an auth middleware sets on `socket.data`. */
  afterInit(server: { use(fn: (socket: any, next: (error?: Error) => void) => void): void }) {
    server.use((socket, next) => {
      const id = socket.handshake.auth?.userId;
      if (typeof id === 'string') socket.data.user = { id };
      next();
    });
  }

  @SubscribeMessage('burst')
  @RateLimit(3, 0.01)
  burst(@MessageBody() n: number) {
    count('burst');
    return { event: 'burst:ok', data: n };
  }

  @SubscribeMessage('acked')
  @RateLimit(3, 0.01)
  acked(@MessageBody() n: number) {
    count('acked');
    return `ok:${n}`;
  }

  @SubscribeMessage('byIp')
  @RateLimit(2, 0.01)
  byIp() {
    return 'ok';
  }

  @SubscribeMessage('byKey')
  @RateLimit(2, 0.01, 'apiKey')
  byKey() {
    return 'ok';
  }

  @SubscribeMessage('byUser')
  @RateLimit(2, 0.01, 'user')
  byUser() {
    return 'ok';
  }

  @SubscribeMessage('byGuardUser')
  @UseGuards(HandshakeUserGuard)
  @RateLimit(2, 0.01, 'user')
  byGuardUser() {
    return 'ok';
  }

  @SubscribeMessage('byRoom')
  @RateLimit(2, 0.01, (ctx) => ctx.switchToWs().getData().room)
  byRoom() {
    return 'ok';
  }

  @SubscribeMessage('refund')
  @RateLimit({ capacity: 2, refillPerSecond: 0.01, refundOn: 'failure' })
  refund(@MessageBody() body: { fail: boolean }) {
    count('refund');
    if (body.fail) throw new WsException({ status: 'error', code: 'HANDLER_FAILED', message: 'failed on purpose' });
    return 'done';
  }
}

/**
 * The ChatGateway of docs/guides/transports.md ("WebSockets"): its handler returns `{ sent: text }`, which socket.io
 * sends as the acknowledgement. The bucket refills at 0.01/s here (1/s in the docs) so that the test
 * does not depend on how fast the emits go out.
 */
@WebSocketGateway()
class ChatGateway {
  @SubscribeMessage('message')
  @RateLimit({ capacity: 10, refillPerSecond: 0.01, keyBy: 'user' })
  message(@MessageBody() text: string) {
    return { sent: text };
  }

  /** What the docs used to return: socket.io emits it as an event and never acknowledges. */
  @SubscribeMessage('asEvent')
  @RateLimit({ capacity: 10, refillPerSecond: 0.01, keyBy: 'user' })
  asEvent(@MessageBody() text: string) {
    return { event: 'sent', data: text };
  }
}

@WebSocketGateway({ namespace: 'class' })
@RateLimit(2, 0.01)
class IoClassGateway {
  @SubscribeMessage('a')
  a() {
    return 'a';
  }

  @SubscribeMessage('b')
  b() {
    return 'b';
  }

  @SubscribeMessage('free')
  @SkipRateLimit()
  free() {
    return 'free';
  }
}

@WebSocketGateway()
class IoClosedGateway {
  @SubscribeMessage('ping')
  @RateLimit(5, 0.01)
  ping() {
    return 'pong';
  }
}

async function startApp(options: RateLimitModuleOptions, gateways: Function[]): Promise<INestApplication> {
  @Module({ imports: [RateLimitModule.forRoot(options)], providers: [...gateways, HandshakeUserGuard] as any[] })
  class IoAppModule {}
  const moduleRef = await Test.createTestingModule({ imports: [IoAppModule] }).compile();
  const app = moduleRef.createNestApplication({ logger: false });
  app.useWebSocketAdapter(new IoAdapter(app));
  await app.listen(0, '127.0.0.1');
  return app;
}

/** Each `emitWithAck`'s answer: the handler's value, or the refusal payload. */
const acks = (client: IoClient, event: string, data: (i: number) => unknown, n: number) =>
  Promise.all(Array.from({ length: n }, (_, i) => client.socket.timeout(3000).emitWithAck(event, data(i))));

describe('@RateLimit on socket.io gateways', () => {
  const prefix = testPrefix('websockets-io');
  let redis: Redis;
  let app: INestApplication;
  let url: string;
  const clients: IoClient[] = [];
  const connect = (options: IoOptions = {}, path = '') => ioClient(url + path, options, clients);

  beforeAll(async () => {
    redis = new Redis(await redisUrl());
    app = await startApp({ redis: await redisUrl(), keyPrefix: prefix }, [IoGateway, IoClassGateway, ChatGateway]);
    url = await app.getUrl();
  });

  afterAll(async () => {
    await closeAll(clients, []);
    await app?.close();
    await deleteKeys(redis, prefix);
    await redis.quit();
  });

  it('10 parallel emits from two connections of one address: exactly 3 handled, 7 `exception` events with the payload', async () => {
    const [one, two] = [await connect(), await connect()];
    for (let i = 0; i < 10; i++) (i % 2 ? two : one).socket.emit('burst', i);
    const both = (event: string) => one.received(event).length + two.received(event).length;
    await until(() => both('burst:ok') + both('exception'), 10, 'answers');
    expect(calls.burst).toBe(3);
    expect(both('burst:ok')).toBe(3);
    const refusals = [...one.received('exception'), ...two.received('exception')];
    expect(refusals).toHaveLength(7);
    for (const payload of refusals) {
      expect(payload).toEqual(RATE_LIMITED);
      expectWholeSeconds(payload as { retryAfter: number });
    }
    expect(await redis.exists(`${prefix}{ip:127.0.0.1}:IoGateway.burst`)).toBe(1);
    expect(await tokensOf(redis, `${prefix}{ip:127.0.0.1}:IoGateway.burst`)).toBeLessThan(0.01);
  });

  it('10 parallel emitWithAck: 3 acks with the value, 7 acks with the payload, and 7 `exception` events', async () => {
    const client = await connect();
    const answers = await acks(client, 'acked', (i) => i, 10);
    await until(() => client.received('exception').length, 7, 'exception events');
    expect(calls.acked).toBe(3);
    expect(answers.filter((a) => typeof a === 'string')).toHaveLength(3);
    for (const a of answers.filter((a) => typeof a === 'string')) expect(a).toMatch(/^ok:\d$/);
    const refused = answers.filter((a) => typeof a !== 'string');
    expect(refused).toHaveLength(7);
    for (const a of refused) expect(a).toEqual(RATE_LIMITED);
    expect(client.received('exception')).toEqual(Array(7).fill(RATE_LIMITED));
  });

  it("the docs' ChatGateway: emitWithAck resolves to { sent } for each of 10 allowed messages, to the refusal for the 11th", async () => {
    const guide = readFileSync(new URL('../../../docs/guides/transports.md', import.meta.url), 'utf8');
    const section = /^## WebSockets\n([\s\S]*?)^## /m.exec(guide)?.[1] ?? '';
    expect(section).toContain(
      "@RateLimit({ capacity: 10, refillPerSecond: 1, keyBy: 'user' })\n  message(@MessageBody() text: string) {\n    return { sent: text };",
    );
    const dana = await connect({ auth: { userId: 'dana' } });
    const answers = await acks(dana, 'message', (i) => `hi ${i}`, 11);
    expect(answers.slice(0, 10)).toEqual(Array.from({ length: 10 }, (_, i) => ({ sent: `hi ${i}` })));
    expect(answers[10]).toEqual({ ...RATE_LIMITED, retryAfter: 100 });
  });

  it('a handler returning { event, data } emits that event and leaves emitWithAck unanswered', async () => {
    const erin = await connect({ auth: { userId: 'erin' } });
    await expect(erin.socket.timeout(500).emitWithAck('asEvent', 'hello')).rejects.toThrow('operation has timed out');
    expect(erin.received('sent')).toEqual(['hello']);
  });

  it('per IP (default): 127.0.0.1 and 127.0.0.2 each get their own bucket {ip:<address>}', async () => {
    const local = await connect();
    const other = await connect({ localAddress: '127.0.0.2' });
    const [a, b] = await Promise.all([acks(local, 'byIp', () => 0, 3), acks(other, 'byIp', () => 0, 3)]);
    for (const answers of [a, b]) {
      expect(answers.filter((x) => x === 'ok')).toHaveLength(2);
      expect(answers.filter((x) => x !== 'ok')).toEqual([RATE_LIMITED]);
    }
    expect(await keysUnder(redis, `${prefix}{ip:127.0.0.`)).toEqual(
      expect.arrayContaining([`${prefix}{ip:127.0.0.1}:IoGateway.byIp`, `${prefix}{ip:127.0.0.2}:IoGateway.byIp`]),
    );
  });

  it("keyBy 'apiKey': x-api-key of the handshake (extraHeaders), one bucket {key:<sha256>} per key; without a key, the IP's", async () => {
    const k1 = await connect({ extraHeaders: { 'x-api-key': 'alpha-key' } });
    const k1again = await connect({ extraHeaders: { 'x-api-key': 'alpha-key' } });
    const k2 = await connect({ extraHeaders: { 'x-api-key': 'beta-key' } });
    const none = await connect();
    // Two connections with one key share its bucket: 2 of 4 between them.
    const [first, second, beta, anonymous] = await Promise.all([
      acks(k1, 'byKey', () => 0, 2),
      acks(k1again, 'byKey', () => 0, 2),
      acks(k2, 'byKey', () => 0, 3),
      acks(none, 'byKey', () => 0, 3),
    ]);
    expect([...first, ...second].filter((x) => x === 'ok')).toHaveLength(2);
    expect([...first, ...second].filter((x) => x !== 'ok')).toEqual([RATE_LIMITED, RATE_LIMITED]);
    for (const answers of [beta, anonymous]) {
      expect(answers.filter((x) => x === 'ok')).toHaveLength(2);
      expect(answers.filter((x) => x !== 'ok')).toEqual([RATE_LIMITED]);
    }
    const keys = (await keysUnder(redis, prefix)).filter((k) => k.endsWith(':IoGateway.byKey'));
    expect(keys).toEqual(
      [
        `${prefix}{key:${sha('alpha-key')}}:IoGateway.byKey`,
        `${prefix}{key:${sha('beta-key')}}:IoGateway.byKey`,
        `${prefix}{ip:127.0.0.1}:IoGateway.byKey`,
      ].sort(),
    );
    // The key itself is never written: no key under this file's prefix names it, whatever its scope.
    expect((await keysUnder(redis, prefix)).filter((k) => /alpha|beta/.test(k))).toEqual([]);
  });

  it("keyBy 'user': client.data.user (socket.io middleware) and client.user (a guard), bucket {user:<id>}", async () => {
    const alice = await connect({ auth: { userId: 'alice' } });
    const bob = await connect({ auth: { userId: 'bob' } });
    const carol = await connect({ auth: { guardUser: 'carol' } });
    const [a, b, c] = await Promise.all([
      acks(alice, 'byUser', () => 0, 3),
      acks(bob, 'byUser', () => 0, 3),
      acks(carol, 'byGuardUser', () => 0, 3),
    ]);
    for (const answers of [a, b, c]) {
      expect(answers.filter((x) => x === 'ok')).toHaveLength(2);
      expect(answers.filter((x) => x !== 'ok')).toEqual([RATE_LIMITED]);
    }
    expect((await keysUnder(redis, `${prefix}{user:`)).filter((key) => key.includes('}:IoGateway.')).sort()).toEqual(
      [
        `${prefix}{user:alice}:IoGateway.byUser`,
        `${prefix}{user:bob}:IoGateway.byUser`,
        `${prefix}{user:carol}:IoGateway.byGuardUser`,
      ].sort(),
    );
  });

  it('a keyBy function reading the message: (ctx) => ctx.switchToWs().getData().room, bucket {id:<room>}', async () => {
    const client = await connect();
    const [lobby, games] = await Promise.all([
      acks(client, 'byRoom', () => ({ room: 'lobby' }), 3),
      acks(client, 'byRoom', () => ({ room: 'games' }), 3),
    ]);
    for (const answers of [lobby, games]) {
      expect(answers.filter((x) => x === 'ok')).toHaveLength(2);
      expect(answers.filter((x) => x !== 'ok')).toEqual([RATE_LIMITED]);
    }
    expect((await keysUnder(redis, `${prefix}{id:`)).sort()).toEqual(
      [`${prefix}{id:games}:IoGateway.byRoom`, `${prefix}{id:lobby}:IoGateway.byRoom`].sort(),
    );
  });

  it('a class-level @RateLimit limits each handler in its own bucket; @SkipRateLimit() exempts one', async () => {
    const client = await connect({}, '/class');
    const [a, b, free] = await Promise.all([
      acks(client, 'a', () => 0, 3),
      acks(client, 'b', () => 0, 3),
      acks(client, 'free', () => 0, 6),
    ]);
    expect(a.filter((x) => x === 'a')).toHaveLength(2);
    expect(a.filter((x) => x !== 'a')).toEqual([RATE_LIMITED]);
    expect(b.filter((x) => x === 'b')).toHaveLength(2);
    expect(b.filter((x) => x !== 'b')).toEqual([RATE_LIMITED]);
    expect(free).toEqual(Array(6).fill('free'));
    expect((await keysUnder(redis, prefix)).filter((k) => k.includes('IoClassGateway')).sort()).toEqual([
      `${prefix}{ip:127.0.0.1}:IoClassGateway.a`,
      `${prefix}{ip:127.0.0.1}:IoClassGateway.b`,
    ]);
  });

  it("refundOn: 'failure': a handler that throws a WsException gives its token back", async () => {
    const client = await connect();
    const key = `${prefix}{ip:127.0.0.1}:IoGateway.refund`;
    // Five failures in a row on a bucket of 2: each is handled (its token comes back) and the client gets the handler's error.
    for (let i = 1; i <= 5; i++) {
      client.socket.emit('refund', { fail: true });
      await until(() => client.received('exception').length, i, 'handler errors', 3000, 0);
    }
    expect(calls.refund).toBe(5);
    expect(client.received('exception')).toEqual(Array(5).fill({ status: 'error', code: 'HANDLER_FAILED', message: 'failed on purpose' }));
    expect(await tokensOf(redis, key)).toBeCloseTo(2, 2);
    // Successes keep their tokens: 2 of 3 then.
    const answers = await acks(client, 'refund', () => ({ fail: false }), 3);
    expect(answers.filter((x) => x === 'done')).toHaveLength(2);
    expect(answers.filter((x) => x !== 'done')).toEqual([RATE_LIMITED]);
    expect(calls.refund).toBe(7);
    expect(await tokensOf(redis, key)).toBeLessThan(0.01);
  });

  it("failureMode 'closed' with its Redis stopped: the ack and the `exception` event carry RATE_LIMIT_UNAVAILABLE", async () => {
    const server = await RedisServer.start();
    const own: IoClient[] = [];
    let closedApp: INestApplication | undefined;
    try {
      closedApp = await startApp({ redis: server.url, failureMode: 'closed', timeoutMs: 100 }, [IoClosedGateway]);
      const client = await ioClient(await closedApp.getUrl(), {}, own);
      expect(await client.socket.timeout(3000).emitWithAck('ping', 1)).toBe('pong');
      await server.stop();
      const answer = await client.socket.timeout(3000).emitWithAck('ping', 2);
      expect(answer).toEqual(UNAVAILABLE);
      expectWholeSeconds(answer);
      await until(() => client.received('exception').length, 1, 'exception events');
      expect(client.received('exception')).toEqual([UNAVAILABLE]);
    } finally {
      await closeAll(own, []);
      await closedApp?.close();
      await server.stop();
    }
  });
});
