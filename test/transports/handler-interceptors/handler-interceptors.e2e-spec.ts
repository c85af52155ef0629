import { Injectable, Module, type ExecutionContext } from '@nestjs/common';
import { INTERCEPTORS_METADATA } from '@nestjs/common/constants.js';
import { Test } from '@nestjs/testing';
import { RateLimit, RateLimitInterceptor, RateLimitModule, SkipRateLimit } from 'nest-redis-rate-limit';
import { deleteKeys, redisUrl, testPrefix } from '../../support/redis.js';

/**
 * WebSocket and microservice handlers with a policy get RateLimitInterceptor on the handler itself when
 * the module is created: a global guard does not reach the handlers of a microservice connected with
 * connectMicroservice() unless inheritAppConfig is set, so a global enhancer alone could leave them
 * silently unlimited (issue 13, item 4). The handlers carry the metadata @SubscribeMessage and
 * @MessagePattern write, set by hand.
 */
@Injectable()
class HandlersLike {
  @RateLimit(5, 1)
  message() {
    return 'sent';
  }

  /** No policy of its own, none on the class, no module defaults: untouched. */
  typing() {
    return 'typing';
  }

  @RateLimit(5, 1)
  rpc() {
    return 'rpc';
  }

  @RateLimit(5, 1)
  @SkipRateLimit()
  skipped() {
    return 'skipped';
  }
}
const proto = HandlersLike.prototype;
Reflect.defineMetadata('websockets:message_mapping', true, proto.message);
Reflect.defineMetadata('websockets:message_mapping', true, proto.typing);
Reflect.defineMetadata('microservices:pattern', [{ cmd: 'x' }], proto.rpc);
Reflect.defineMetadata('microservices:pattern', [{ cmd: 'y' }], proto.skipped);

const interceptorsOf = (handler: Function) => (Reflect.getMetadata(INTERCEPTORS_METADATA, handler) ?? []) as unknown[];
const ours = (handler: Function) => interceptorsOf(handler).filter((i) => i instanceof RateLimitInterceptor);

describe('interceptors on WebSocket and microservice handlers', () => {
  it('puts one RateLimitInterceptor on each handler with a policy, at module creation, and none elsewhere', async () => {
    @Module({
      imports: [RateLimitModule.forRoot({ redis: await redisUrl(), keyPrefix: testPrefix('handler-interceptors') })],
      providers: [HandlersLike],
    })
    class AppModule {}
    const first = await Test.createTestingModule({ imports: [AppModule] }).compile();
    expect(ours(proto.message)).toHaveLength(1);
    expect(ours(proto.rpc)).toHaveLength(1);
    expect(interceptorsOf(proto.typing)).toHaveLength(0);
    expect(interceptorsOf(proto.skipped)).toHaveLength(0);
    const firstInterceptor = ours(proto.message)[0];
    // A second app in the same process does not stack a second one: its own replaces the first app's
    // (an app reads its handlers' enhancers when it starts, so a started one keeps its own).
    const second = await Test.createTestingModule({ imports: [AppModule] }).compile();
    expect(ours(proto.message)).toHaveLength(1);
    expect(ours(proto.message)[0]).not.toBe(firstInterceptor);
    await first.close();
    await second.close();
  });

  it('with module defaults, a handler without a policy of its own gets one too', async () => {
    @Injectable()
    class Plain {
      handle(_context?: ExecutionContext) {
        return 'plain';
      }
    }
    Reflect.defineMetadata('websockets:message_mapping', true, Plain.prototype.handle);
    @Module({
      imports: [
        RateLimitModule.forRoot({
          redis: await redisUrl(),
          keyPrefix: testPrefix('handler-interceptors'),
          defaults: { capacity: 9, refillPerSecond: 1 },
        }),
      ],
      providers: [Plain],
    })
    class DefaultsModule {}
    const moduleRef = await Test.createTestingModule({ imports: [DefaultsModule] }).compile();
    expect(ours(Plain.prototype.handle)).toHaveLength(1);
    await moduleRef.close();
  });
});

describe('one gateway class in two running apps', () => {
  it('each app limits its messages through its own module (its own key prefix)', async () => {
    const { WebSocketGateway, SubscribeMessage } = await import('@nestjs/websockets');
    const { IoAdapter } = await import('@nestjs/platform-socket.io');
    const { io } = await import('socket.io-client');
    const { Redis } = await import('ioredis');
    class Shared {
      ping() {
        return 'pong';
      }
    }
    SubscribeMessage('ping')(Shared.prototype, 'ping', Object.getOwnPropertyDescriptor(Shared.prototype, 'ping')!);
    RateLimit(5, 1)(Shared.prototype, 'ping', Object.getOwnPropertyDescriptor(Shared.prototype, 'ping')!);
    WebSocketGateway()(Shared);
    Injectable()(Shared);
    const client = new Redis(await redisUrl());
    const prefixes = [testPrefix('two-apps-a'), testPrefix('two-apps-b')];
    const apps = [];
    try {
      for (const keyPrefix of prefixes) {
        @Module({ imports: [RateLimitModule.forRoot({ redis: await redisUrl(), keyPrefix })], providers: [Shared] })
        class AppModule {}
        const moduleRef = await Test.createTestingModule({ imports: [AppModule] }).compile();
        const app = moduleRef.createNestApplication({ logger: false });
        app.useWebSocketAdapter(new IoAdapter(app));
        await app.listen(0, '127.0.0.1');
        apps.push(app);
      }
      for (const [i, app] of apps.entries()) {
        const socket = io(await app.getUrl(), { transports: ['websocket'], forceNew: true });
        try {
          expect(await socket.timeout(2000).emitWithAck('ping', i)).toBe('pong');
        } finally {
          socket.close();
        }
        expect(await client.exists(`${prefixes[i]}{ip:127.0.0.1}:Shared.ping`)).toBe(1);
      }
    } finally {
      await Promise.all(apps.map((app) => app.close()));
      for (const prefix of prefixes) await deleteKeys(client, prefix);
      client.disconnect();
    }
  });
});
