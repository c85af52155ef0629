import type { AddressInfo } from 'node:net';
import {
  type CallHandler,
  Controller,
  type ExecutionContext,
  type INestApplication,
  type INestMicroservice,
  Injectable,
  Module,
  type NestInterceptor,
  UseInterceptors,
} from '@nestjs/common';
import { ApolloDriver, type ApolloDriverConfig } from '@nestjs/apollo';
import { Args, GraphQLModule, Query, Resolver } from '@nestjs/graphql';
import { ClientProxyFactory, type ClientProxy, MessagePattern, Payload, Transport } from '@nestjs/microservices';
import { WsAdapter } from '@nestjs/platform-ws';
import { MessageBody, SubscribeMessage, WebSocketGateway } from '@nestjs/websockets';
import { Test } from '@nestjs/testing';
import { Redis } from 'ioredis';
import { firstValueFrom, type Observable, timeout } from 'rxjs';
import request from 'supertest';
import { ConcurrencyLimit, RateLimit, RateLimitModule } from 'nest-redis-rate-limit';
import { Gates } from '../../policies/concurrency/concurrency.controller.js';
import { createApp } from '../../support/app.js';
import { freePort, redisUrl, testPrefix } from '../../support/redis.js';
import { closeAll, type WsClient, wsClient } from '../websockets/clients.js';

/**
 * @ConcurrencyLimit beyond HTTP routes (issue 36, item 1): a GraphQL resolver, a WebSocket message
 * handler and a microservice message handler hold their slot while they run, and give it back when
 * they return or throw; a call beyond the limit gets its transport's refusal. The WebSocket and
 * microservice handlers also have a rate policy keyed by a function (decided after the guards, with the
 * slot, in one store call): a call refused for its slot takes no token.
 */
const gates = new Gates();
const prefix = testPrefix('concurrency-transports');

@Resolver()
class SlowResolver {
  @Query(() => String, { nullable: true })
  @ConcurrencyLimit({ limit: 1, name: 'gql' })
  async slow(@Args('id') id: string) {
    await gates.gate(id);
    if (id.startsWith('fail')) throw new Error('resolver failed');
    return id;
  }
}

@WebSocketGateway({ path: '/slots' })
class SlowGateway {
  @SubscribeMessage('slow')
  @RateLimit({ capacity: 100, refillPerSecond: 0.001, name: 'ws-rate', keyBy: () => 'all' })
  @ConcurrencyLimit({ limit: 1, name: 'ws', keyBy: () => 'all' })
  async slow(@MessageBody() id: string) {
    await gates.gate(id);
    if (id.startsWith('fail')) throw new Error('handler failed');
    return { event: 'done', data: id };
  }
}

/** The app's own timeout around a handler (outside RateLimitInterceptor): 300 ms for payloads `short-*`. */
@Injectable()
class ShortTimeout implements NestInterceptor {
  intercept(context: ExecutionContext, next: CallHandler): Observable<unknown> {
    const id = context.switchToRpc().getData<string>();
    return id.startsWith('short-') ? next.handle().pipe(timeout(300)) : next.handle();
  }
}

@Controller()
class SlowHandlers {
  /** One slot, waited for up to 3 s, inside the app's timeout: a message the timeout ended must not keep waiting. */
  @MessagePattern({ cmd: 'timed' })
  @ConcurrencyLimit({ limit: 1, name: 'rpc-timed', keyBy: () => 'all', maxWaitMs: 3000 })
  @UseInterceptors(ShortTimeout)
  async timed(@Payload() id: string) {
    await gates.gate(id);
    return id;
  }

  @MessagePattern({ cmd: 'slow' })
  @RateLimit({ capacity: 100, refillPerSecond: 0.001, name: 'rpc-rate', keyBy: () => 'all' })
  @ConcurrencyLimit({ limit: 1, name: 'rpc', keyBy: () => 'all' })
  async slow(@Payload() id: string) {
    await gates.gate(id);
    if (id.startsWith('fail')) throw new Error('handler failed');
    return id;
  }
}

describe('@ConcurrencyLimit on GraphQL, WebSocket and microservice handlers', () => {
  let redis: Redis;
  beforeAll(async () => {
    redis = new Redis(await redisUrl());
  });
  afterAll(async () => {
    await redis.quit();
  });
  afterEach(() => gates.openAll());

  async function slotKeys(scope: string): Promise<string[]> {
    return (await redis.keys(`${prefix}*`)).filter((key) => key.endsWith(`}!${scope}`));
  }

  /** The tokens left in the one bucket of a rate policy (keyed by a function: one identity). */
  async function tokensOf(scope: string): Promise<number> {
    const [key] = (await redis.keys(`${prefix}*`)).filter((k) => k.endsWith(`}:${scope}`));
    return Number(await redis.hget(key, 'tokens'));
  }

  async function settled(scope: string): Promise<void> {
    for (let i = 0; i < 100 && (await slotKeys(scope)).length > 0; i++) await new Promise((resolve) => setTimeout(resolve, 10));
    expect(await slotKeys(scope)).toEqual([]);
  }

  it('GraphQL: a second field while the first runs is refused with RATE_LIMITED, and the slot comes back after a throw', async () => {
    @Module({
      imports: [
        RateLimitModule.forRoot({ redis: await redisUrl(), keyPrefix: prefix }),
        GraphQLModule.forRoot<ApolloDriverConfig>({ driver: ApolloDriver, autoSchemaFile: true }),
      ],
      providers: [SlowResolver],
    })
    class GraphQLSlotsModule {}
    const app: INestApplication = await createApp(GraphQLSlotsModule, 'express');
    await app.listen(0, '127.0.0.1');
    try {
      const post = (id: string) =>
        request(app.getHttpServer())
          .post('/graphql')
          .send({ query: `{ slow(id: "${id}") }` })
          // Sent now: supertest sends a request when it is awaited.
          .then((response) => response);
      const first = post('g1');
      await gates.waitingFor(1);
      const refused = await post('g2');
      expect(refused.body.data).toEqual({ slow: null });
      expect(refused.body.errors[0].extensions).toMatchObject({ code: 'RATE_LIMITED', retryAfter: 1 });
      gates.open('fail-g3');
      gates.open('g1');
      expect((await first).body.data).toEqual({ slow: 'g1' });
      expect((await post('fail-g3')).body.errors[0].message).toBe('resolver failed');
      gates.open('g4');
      expect((await post('g4')).body.data).toEqual({ slow: 'g4' });
      await settled('gql');
    } finally {
      await app.close();
    }
  });

  it('WebSocket (ws): a second message while the first runs gets the exception message, and the slot comes back after a throw', async () => {
    @Module({ imports: [RateLimitModule.forRoot({ redis: await redisUrl(), keyPrefix: prefix })], providers: [SlowGateway] })
    class WsSlotsModule {}
    const moduleRef = await Test.createTestingModule({ imports: [WsSlotsModule] }).compile();
    const app = moduleRef.createNestApplication({ logger: false });
    app.useWebSocketAdapter(new WsAdapter(app));
    await app.listen(0, '127.0.0.1');
    const opened: WsClient[] = [];
    try {
      const url = `ws://127.0.0.1:${(app.getHttpServer().address() as AddressInfo).port}/slots`;
      const client = await wsClient(url, {}, opened);
      client.send('slow', 'w1');
      await gates.waitingFor(1);
      client.send('slow', 'w2');
      for (let i = 0; i < 100 && client.of('exception').length === 0; i++) await new Promise((resolve) => setTimeout(resolve, 10));
      expect(client.of('exception')).toEqual([expect.objectContaining({ code: 'RATE_LIMITED', retryAfter: 1 })]);
      gates.open('w1');
      gates.open('fail-w3');
      gates.open('w4');
      for (let i = 0; i < 100 && client.of('done').length === 0; i++) await new Promise((resolve) => setTimeout(resolve, 10));
      await settled('ws');
      client.send('slow', 'fail-w3');
      await new Promise((resolve) => setTimeout(resolve, 100));
      await settled('ws');
      client.send('slow', 'w4');
      for (let i = 0; i < 100 && client.of('done').length < 2; i++) await new Promise((resolve) => setTimeout(resolve, 10));
      expect(client.of('done')).toEqual(['w1', 'w4']);
      await settled('ws');
      // w1, fail-w3 and w4 ran; w2, refused for its slot, took no token.
      expect(await tokensOf('ws-rate')).toBeGreaterThanOrEqual(97);
      expect(await tokensOf('ws-rate')).toBeLessThan(97.5);
    } finally {
      await closeAll([], opened);
      await app.close();
    }
  });

  it('TCP microservice: a second message while the first runs errors with RATE_LIMITED, and the slot comes back after a throw', async () => {
    @Module({ imports: [RateLimitModule.forRoot({ redis: await redisUrl(), keyPrefix: prefix })], controllers: [SlowHandlers] })
    class RpcSlotsModule {}
    const moduleRef = await Test.createTestingModule({ imports: [RpcSlotsModule] }).compile();
    const port = await freePort();
    const microservice: INestMicroservice = moduleRef.createNestMicroservice({
      transport: Transport.TCP,
      options: { host: '127.0.0.1', port },
      logger: false,
    });
    await microservice.listen();
    const client: ClientProxy = ClientProxyFactory.create({ transport: Transport.TCP, options: { host: '127.0.0.1', port } });
    await client.connect();
    try {
      const send = (id: string) => firstValueFrom(client.send({ cmd: 'slow' }, id)).catch((error: unknown) => ({ error }));
      const first = send('r1');
      await gates.waitingFor(1);
      expect(await send('r2')).toEqual({ error: expect.objectContaining({ code: 'RATE_LIMITED', retryAfter: 1 }) });
      gates.open('r1');
      expect(await first).toBe('r1');
      gates.open('fail-r3');
      expect(await send('fail-r3')).toEqual({ error: expect.objectContaining({ message: 'Internal server error' }) });
      gates.open('r4');
      expect(await send('r4')).toBe('r4');
      await settled('rpc');
      // r1, fail-r3 and r4 ran; r2, refused for its slot, took no token.
      expect(await tokensOf('rpc-rate')).toBeGreaterThanOrEqual(97);
      expect(await tokensOf('rpc-rate')).toBeLessThan(97.5);

      // A message waiting for its slot when the app's timeout ends it: it gives up the wait, and the slot
      // freed later is not taken for a handler nobody will run (no response closes here to say so).
      const timed = (id: string) => firstValueFrom(client.send({ cmd: 'timed' }, id)).catch((error: unknown) => ({ error }));
      const holder = timed('hold-1');
      await gates.waitingFor(1);
      expect(await timed('short-2')).toEqual({ error: expect.anything() });
      gates.open('hold-1');
      expect(await holder).toBe('hold-1');
      await new Promise((resolve) => setTimeout(resolve, 300));
      await settled('rpc-timed');
      expect(gates.entered.filter((id) => id === 'hold-1' || id === 'short-2')).toEqual(['hold-1']);
    } finally {
      await client.close();
      await microservice.close();
    }
  });
});
