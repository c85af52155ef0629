import { Module } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { IoAdapter } from '@nestjs/platform-socket.io';
import { WsAdapter } from '@nestjs/platform-ws';
import { type OnGatewayInit, SubscribeMessage, WebSocketGateway } from '@nestjs/websockets';
import { io } from 'socket.io-client';
import WebSocket from 'ws';
import { BucketService, ConnectionRateLimit, RateLimitModule } from 'nest-redis-rate-limit';
import { redisUrl } from '../../support/redis.js';
import { redisScenario } from '../../support/scenario.js';

/**
 * Issue 13, item 2: a connection-rate limit for gateways (handshakes per IP), on socket.io (middleware)
 * and ws (verifyClient), against the shared Redis: of N simultaneous handshakes from one address,
 * exactly `capacity` connect.
 */
const CAPACITY = 3;
const ATTEMPTS = 8;

@WebSocketGateway()
class IoGateway implements OnGatewayInit {
  private readonly connections: ConnectionRateLimit;
  constructor(buckets: BucketService) {
    this.connections = new ConnectionRateLimit(buckets, { capacity: CAPACITY, refillPerSecond: 0.01, name: 'io-connect' });
  }
  afterInit(server: { use(middleware: unknown): void }) {
    server.use(this.connections.socketIo());
  }
  @SubscribeMessage('noop')
  noop() {
    return 'ok';
  }
}

@WebSocketGateway()
class WsGateway implements OnGatewayInit {
  private readonly connections: ConnectionRateLimit;
  constructor(buckets: BucketService) {
    this.connections = new ConnectionRateLimit(buckets, { capacity: CAPACITY, refillPerSecond: 0.01, name: 'ws-connect' });
  }
  afterInit(server: { options: Record<string, unknown> }) {
    server.options.verifyClient = this.connections.ws();
  }
  @SubscribeMessage('noop')
  noop() {
    return 'ok';
  }
}

describe('a connection-rate limit for gateways', () => {
  const scenario = redisScenario('connections');

  async function start(gateway: Function, adapter: 'io' | 'ws'): Promise<string> {
    @Module({ imports: [RateLimitModule.forRoot({ redis: await redisUrl(), keyPrefix: scenario.prefix })], providers: [gateway as never] })
    class AppModule {}
    const moduleRef = await Test.createTestingModule({ imports: [AppModule] }).compile();
    const app = moduleRef.createNestApplication({ logger: false });
    app.useWebSocketAdapter(adapter === 'io' ? new IoAdapter(app) : new WsAdapter(app));
    await app.listen(0, '127.0.0.1');
    scenario.track(app);
    return app.getUrl();
  }

  it(`socket.io: ${CAPACITY} of ${ATTEMPTS} simultaneous handshakes connect, the others get connect_error RATE_LIMITED`, async () => {
    const url = await start(IoGateway, 'io');
    const outcomes = await Promise.all(
      Array.from({ length: ATTEMPTS }, () => {
        const socket = io(url, { transports: ['websocket'], reconnection: false, forceNew: true });
        return new Promise<{ ok: boolean; error?: { message: string; data?: unknown } }>((resolve) => {
          socket.on('connect', () => resolve({ ok: true }));
          socket.on('connect_error', (error: Error & { data?: unknown }) =>
            resolve({ ok: false, error: { message: error.message, data: error.data } }),
          );
        }).finally(() => socket.close());
      }),
    );
    expect(outcomes.filter((o) => o.ok)).toHaveLength(CAPACITY);
    const refused = outcomes.filter((o) => !o.ok);
    expect(refused).toHaveLength(ATTEMPTS - CAPACITY);
    for (const o of refused) expect(o.error).toEqual({ message: 'Too Many Requests', data: { code: 'RATE_LIMITED', retryAfter: 100 } });
    expect(await scenario.client.exists(`${scenario.prefix}{io-connect:ip:127.0.0.1}`)).toBe(1);
  });

  it(`ws: ${CAPACITY} of ${ATTEMPTS} simultaneous upgrades open, the others are answered 429 with Retry-After`, async () => {
    const url = (await start(WsGateway, 'ws')).replace('http', 'ws');
    const outcomes = await Promise.all(
      Array.from({ length: ATTEMPTS }, () => {
        const socket = new WebSocket(url);
        return new Promise<{ ok: boolean; status?: number; retryAfter?: string }>((resolve) => {
          socket.on('open', () => resolve({ ok: true }));
          socket.on('unexpected-response', (_req, res) =>
            resolve({ ok: false, status: res.statusCode, retryAfter: res.headers['retry-after'] as string }),
          );
          socket.on('error', () => undefined);
        }).finally(() => socket.terminate());
      }),
    );
    expect(outcomes.filter((o) => o.ok)).toHaveLength(CAPACITY);
    const refused = outcomes.filter((o) => !o.ok);
    expect(refused).toHaveLength(ATTEMPTS - CAPACITY);
    for (const o of refused) expect(o).toEqual({ ok: false, status: 429, retryAfter: '100' });
    expect(await scenario.client.exists(`${scenario.prefix}{ws-connect:ip:127.0.0.1}`)).toBe(1);
  });

  it('refuses a policy that is not one, naming the class', () => {
    expect(() => new ConnectionRateLimit({} as BucketService, { capacity: 0, refillPerSecond: 1 })).toThrow(/ConnectionRateLimit/);
  });
});
