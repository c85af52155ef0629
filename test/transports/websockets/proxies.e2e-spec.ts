import { Controller, Get, type INestApplication, Logger, Module } from '@nestjs/common';
import { ApolloDriver, type ApolloDriverConfig } from '@nestjs/apollo';
import { GraphQLModule, Query, Resolver } from '@nestjs/graphql';
import type { NestExpressApplication } from '@nestjs/platform-express';
import { IoAdapter } from '@nestjs/platform-socket.io';
import { WsAdapter } from '@nestjs/platform-ws';
import { SubscribeMessage, WebSocketGateway } from '@nestjs/websockets';
import { createClient } from 'graphql-ws';
import { Redis } from 'ioredis';
import request from 'supertest';
import WebSocket from 'ws';
import { RateLimit, RateLimitModule, type RateLimitModuleOptions } from 'nest-redis-rate-limit';
import { createApp, PLATFORMS, type Platform } from '../../support/app.js';
import { LogRecorder } from '../../support/log-recorder.js';
import { deleteKeys, freePort, redisUrl, testPrefix, tokensOf } from '../../support/redis.js';
import { closeAll, type IoClient, ioClient, RATE_LIMITED, until, type WsClient, wsClient } from './clients.js';

/**
 * Issue 22, finding 3: WebSocket-borne calls behind a proxy. The test client connects from 127.0.0.1,
 * the proxy, and names its client in X-Forwarded-For, as the proxy would. With the app's trust-proxy
 * setting, a socket.io message and a graphql-ws operation are the forwarded client's, as an HTTP
 * request is: one bucket per client, shared with HTTP where the policy's name is, and an allow-listed
 * proxy exempts nobody behind it. Without the setting, the header is ignored.
 */
const SHARED = { capacity: 3, refillPerSecond: 0.01, name: 'px-shared' } as const;

@Controller('px')
class ProxyController {
  @Get('shared')
  @RateLimit(SHARED)
  shared() {
    return { ok: true };
  }
}

@WebSocketGateway()
class ProxyGateway {
  @SubscribeMessage('shared')
  @RateLimit(SHARED)
  shared() {
    return 'ok';
  }
}

@Resolver()
class ProxyResolver {
  @Query(() => Boolean)
  @RateLimit(SHARED)
  shared() {
    return true;
  }
}

@WebSocketGateway({ path: '/ws' })
class WsProxyGateway {
  @SubscribeMessage('ping')
  @RateLimit(3, 0.01)
  ping() {
    return { event: 'pong', data: 'ok' };
  }
}

const emits = (client: IoClient, n: number) =>
  Promise.all(Array.from({ length: n }, () => client.socket.timeout(3000).emitWithAck('shared', 0)));
const tally = (answers: unknown[]) => ({
  ok: answers.filter((a) => a === 'ok').length,
  refused: answers.filter((a) => JSON.stringify(a) === JSON.stringify(RATE_LIMITED)).length,
});

describe.each(PLATFORMS)('socket.io messages behind a proxy, on %s', (platform: Platform) => {
  const prefix = testPrefix(`ws-proxies-${platform}`);
  let redis: Redis;
  const apps: INestApplication[] = [];
  const clients: IoClient[] = [];

  async function start(options: Partial<RateLimitModuleOptions>, trustProxy: boolean): Promise<{ url: string; prefix: string }> {
    const keyPrefix = `${prefix}${apps.length}:`;
    @Module({
      imports: [RateLimitModule.forRoot({ redis: await redisUrl(), keyPrefix, ...options })],
      controllers: [ProxyController],
      providers: [ProxyGateway],
    })
    class ProxyAppModule {}
    const app = await createApp(ProxyAppModule, platform, (a) => a.useWebSocketAdapter(new IoAdapter(a)), trustProxy ? { trustProxy } : {});
    apps.push(app);
    await app.listen(0, '127.0.0.1');
    return { url: await app.getUrl(), prefix: keyPrefix };
  }
  const from = (url: string, client: string) => ioClient(url, { extraHeaders: { 'x-forwarded-for': client } }, clients);

  beforeAll(async () => {
    redis = new Redis(await redisUrl());
  });
  afterAll(async () => {
    await closeAll(clients, []);
    for (const app of apps) await app.close();
    await deleteKeys(redis, prefix);
    await redis.quit();
  });

  describe('trust proxy set, the proxy (127.0.0.1) on allowList.ips', () => {
    let url: string;
    let keys: string;
    beforeAll(async () => {
      ({ url, prefix: keys } = await start({ allowList: { ips: ['127.0.0.1'] } }, true));
    });

    it('two clients behind the proxy get a bucket each, {ip:<forwarded address>}: 3 of 4 each, none exempt', async () => {
      const [a, b] = [await from(url, '203.0.113.1'), await from(url, '203.0.113.2')];
      const [first, second] = await Promise.all([emits(a, 4), emits(b, 4)]);
      expect(tally(first)).toEqual({ ok: 3, refused: 1 });
      expect(tally(second)).toEqual({ ok: 3, refused: 1 });
      expect(await tokensOf(redis, `${keys}{ip:203.0.113.1}:px-shared`)).toBeCloseTo(0, 1);
      expect(await tokensOf(redis, `${keys}{ip:203.0.113.2}:px-shared`)).toBeCloseTo(0, 1);
    });

    it('one client’s HTTP requests and socket.io messages share the named policy’s bucket: 2 over HTTP leave 1 message', async () => {
      const http = request(url);
      for (let i = 0; i < 2; i++) await http.get('/px/shared').set('x-forwarded-for', '203.0.113.3').expect(200);
      const client = await from(url, '203.0.113.3');
      expect(tally(await emits(client, 3))).toEqual({ ok: 1, refused: 2 });
      expect(await tokensOf(redis, `${keys}{ip:203.0.113.3}:px-shared`)).toBeCloseTo(0, 1);
    });
  });

  it('a gateway on a port of its own has no trust-proxy setting: the forwarded header is ignored there, 3 of 6 for the peer', async () => {
    const port = await freePort();
    @WebSocketGateway(port)
    class OwnPortGateway {
      @SubscribeMessage('shared')
      @RateLimit(SHARED)
      shared() {
        return 'ok';
      }
    }
    const keyPrefix = `${prefix}own:`;
    @Module({ imports: [RateLimitModule.forRoot({ redis: await redisUrl(), keyPrefix })], providers: [OwnPortGateway] })
    class OwnPortModule {}
    const app = await createApp(OwnPortModule, platform, (a) => a.useWebSocketAdapter(new IoAdapter(a)), { trustProxy: true });
    apps.push(app);
    await app.listen(0, '127.0.0.1');
    const url = `http://127.0.0.1:${port}`;
    const [a, b] = [await from(url, '203.0.113.10'), await from(url, '203.0.113.11')];
    expect(tally([...(await emits(a, 3)), ...(await emits(b, 3))])).toEqual({ ok: 3, refused: 3 });
    expect(await tokensOf(redis, `${keyPrefix}{ip:127.0.0.1}:px-shared`)).toBeCloseTo(0, 1);
  });

  it('without trust proxy the forwarded header is ignored: two "clients" share the proxy’s bucket, 3 of 6', async () => {
    const { url, prefix: keys } = await start({}, false);
    const [a, b] = [await from(url, '203.0.113.4'), await from(url, '203.0.113.5')];
    const answers = [...(await emits(a, 3)), ...(await emits(b, 3))];
    expect(tally(answers)).toEqual({ ok: 3, refused: 3 });
    expect(await tokensOf(redis, `${keys}{ip:127.0.0.1}:px-shared`)).toBeCloseTo(0, 1);
    expect(await redis.exists(`${keys}{ip:203.0.113.4}:px-shared`, `${keys}{ip:203.0.113.5}:px-shared`)).toBe(0);
  });
});

describe('graphql-ws operations and ws messages behind a proxy (Express, trust proxy set, the proxy on allowList.ips)', () => {
  const prefix = testPrefix('ws-proxies-graphql');
  const recorder = new LogRecorder();
  let redis: Redis;
  const apps: INestApplication[] = [];
  const wsClients: WsClient[] = [];

  async function start(module: Function, configure?: (app: INestApplication) => void): Promise<string> {
    const app = await createApp(module, 'express', configure, { trustProxy: true });
    apps.push(app);
    await app.listen(0, '127.0.0.1');
    Logger.overrideLogger(recorder);
    return (await app.getUrl()).replace('http', 'ws');
  }

  beforeAll(async () => {
    redis = new Redis(await redisUrl());
  });
  afterAll(async () => {
    Logger.overrideLogger(false);
    await closeAll([], wsClients);
    for (const app of apps) await app.close();
    await deleteKeys(redis, prefix);
    await redis.quit();
  });

  it('a query over graphql-ws is the forwarded client’s: its own bucket, shared with HTTP by name, and not exempt', async () => {
    const options = { redis: await redisUrl(), keyPrefix: prefix, allowList: { ips: ['127.0.0.1'] } };
    @Module({
      imports: [
        RateLimitModule.forRoot(options),
        GraphQLModule.forRoot<ApolloDriverConfig>({ driver: ApolloDriver, autoSchemaFile: true, subscriptions: { 'graphql-ws': true } }),
      ],
      controllers: [ProxyController],
      providers: [ProxyResolver],
    })
    class GraphqlProxyModule {}
    const url = await start(GraphqlProxyModule);
    /** A graphql-ws connection from the proxy, for `client`: the answers of `n` queries. */
    async function queries(client: string, n: number): Promise<string[]> {
      class Forwarded extends WebSocket {
        constructor(address: string, protocols?: string | string[]) {
          super(address, protocols, { headers: { 'x-forwarded-for': client } });
        }
      }
      const ws = createClient({ url: `${url}/graphql`, webSocketImpl: Forwarded, retryAttempts: 0 });
      const answers: string[] = [];
      try {
        for (let i = 0; i < n; i++) {
          const result = await new Promise<any>((resolve, reject) => {
            let value: any;
            ws.subscribe({ query: '{ shared }' }, { next: (v) => (value = v), error: reject, complete: () => resolve(value) });
          });
          answers.push(result.errors ? result.errors[0].extensions.code : String(result.data.shared));
        }
      } finally {
        await ws.dispose();
      }
      return answers;
    }
    expect(await queries('203.0.113.6', 4)).toEqual(['true', 'true', 'true', 'RATE_LIMITED']);
    expect(await queries('203.0.113.7', 4)).toEqual(['true', 'true', 'true', 'RATE_LIMITED']);
    const http = `http${url.slice(2)}`;
    await request(http).get('/px/shared').set('x-forwarded-for', '203.0.113.8').expect(200);
    expect(await queries('203.0.113.8', 3)).toEqual(['true', 'true', 'RATE_LIMITED']);
    for (const client of ['203.0.113.6', '203.0.113.7', '203.0.113.8']) {
      expect(await tokensOf(redis, `${prefix}{ip:${client}}:px-shared`)).toBeCloseTo(0, 1);
    }
  });

  it('ws keeps no handshake headers: behind a trusted proxy a message is not the proxy’s, so the allow-list exempts none (ip:unknown), said once', async () => {
    const keyPrefix = `${prefix}ws:`;
    @Module({
      imports: [RateLimitModule.forRoot({ redis: await redisUrl(), keyPrefix, allowList: { ips: ['127.0.0.1'] } })],
      providers: [WsProxyGateway],
    })
    class WsProxyModule {}
    const url = await start(WsProxyModule, (app) => (app as NestExpressApplication).useWebSocketAdapter(new WsAdapter(app)));
    recorder.clear();
    const client = await wsClient(`${url}/ws`, { headers: { 'x-forwarded-for': '203.0.113.9' } }, wsClients);
    for (let i = 0; i < 4; i++) client.send('ping', i);
    await until(() => client.messages.length, 4, 'answers');
    expect(client.of('pong')).toHaveLength(3);
    expect(client.of('exception')).toEqual([RATE_LIMITED]);
    expect(await tokensOf(redis, `${keyPrefix}{ip:unknown}:WsProxyGateway.ping`)).toBeCloseTo(0, 1);
    const lines = recorder.of('RateLimit', 'warn').filter((line) => line.includes('WsProxyGateway.ping'));
    expect(lines).toHaveLength(1);
    expect(lines[0]).toContain('trusted proxy');
  });
});
