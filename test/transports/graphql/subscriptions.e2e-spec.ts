import { type INestApplication, Module } from '@nestjs/common';
import { ApolloDriver, type ApolloDriverConfig } from '@nestjs/apollo';
import { GraphQLModule, Query, Resolver, Subscription } from '@nestjs/graphql';
import { Test } from '@nestjs/testing';
import { createClient } from 'graphql-ws';
import { Redis } from 'ioredis';
import WebSocket from 'ws';
import { RateLimit, RateLimitModule } from 'nest-redis-rate-limit';
import { deleteKeys, redisUrl, testPrefix } from '../../support/redis.js';

/**
 * Issue 13, item 1: GraphQL subscriptions never crash. Over graphql-ws (Apollo), the policy is decided
 * once per subscription, when the client subscribes, by the address of its connection; a refused
 * subscription gets the RATE_LIMITED error and completes; no headers (there is no HTTP response).
 */
const SCHEMA = `
  type Query { ok: Boolean! }
  type Subscription { ticks: Int! }
`;

@Resolver()
class TicksResolver {
  @Query('ok')
  ok() {
    return true;
  }

  @Subscription('ticks')
  @RateLimit(2, 0.01)
  ticks() {
    return (async function* () {
      for (let i = 1; i <= 2; i++) yield { ticks: i };
    })();
  }
}

describe('GraphQL subscriptions over graphql-ws (Apollo)', () => {
  const prefix = testPrefix('graphql-subscriptions');
  let client: Redis;
  let app: INestApplication;
  let url: string;

  beforeAll(async () => {
    client = new Redis(await redisUrl());
    @Module({
      imports: [
        RateLimitModule.forRoot({ redis: await redisUrl(), keyPrefix: prefix }),
        GraphQLModule.forRoot<ApolloDriverConfig>({ driver: ApolloDriver, typeDefs: SCHEMA, subscriptions: { 'graphql-ws': true } }),
      ],
      providers: [TicksResolver],
    })
    class AppModule {}
    const moduleRef = await Test.createTestingModule({ imports: [AppModule] }).compile();
    app = moduleRef.createNestApplication({ logger: false });
    await app.listen(0, '127.0.0.1');
    url = (await app.getUrl()).replace('http', 'ws') + '/graphql';
  });

  afterAll(async () => {
    await app.close();
    await deleteKeys(client, prefix);
    client.disconnect();
  });

  /** One subscription on its own connection: what it received, in order. */
  async function subscribe(): Promise<unknown[]> {
    const ws = createClient({ url, webSocketImpl: WebSocket, retryAttempts: 0, lazy: true });
    try {
      return await new Promise<unknown[]>((resolve, reject) => {
        const received: unknown[] = [];
        ws.subscribe(
          { query: 'subscription { ticks }' },
          {
            next: (value) => received.push(value),
            error: (error) => (Array.isArray(error) ? resolve([...received, { errors: error }]) : reject(error)),
            complete: () => resolve(received),
          },
        );
      });
    } finally {
      await ws.dispose();
    }
  }

  it('decides each subscription once, by the connection’s address: 2 run, the third gets RATE_LIMITED', async () => {
    const outcomes = [];
    for (let i = 0; i < 3; i++) outcomes.push(await subscribe());
    expect(outcomes[0]).toEqual([{ data: { ticks: 1 } }, { data: { ticks: 2 } }]);
    expect(outcomes[1]).toEqual([{ data: { ticks: 1 } }, { data: { ticks: 2 } }]);
    expect(outcomes[2]).toHaveLength(1);
    expect(outcomes[2][0]).toMatchObject({
      errors: [{ message: 'Too Many Requests', path: ['ticks'], extensions: { code: 'RATE_LIMITED', retryAfter: 100 } }],
    });
    expect(await client.exists(`${prefix}{ip:127.0.0.1}:TicksResolver.ticks`)).toBe(1);
  });
});
