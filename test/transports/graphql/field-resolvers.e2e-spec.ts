import { type INestApplication, Logger, Module } from '@nestjs/common';
import { ApolloDriver, type ApolloDriverConfig } from '@nestjs/apollo';
import { Field, GraphQLModule, Int, ObjectType, Query, ResolveField, Resolver } from '@nestjs/graphql';
import { Redis } from 'ioredis';
import { RateLimit, RateLimitModule } from 'nest-redis-rate-limit';
import { createApp } from '../../support/app.js';
import { LogRecorder } from '../../support/log-recorder.js';
import { deleteKeys, redisUrl, testPrefix } from '../../support/redis.js';

/**
 * Issue 22, finding 8: with `fieldResolverEnhancers: ['guards']` Nest runs no interceptor on a field
 * resolver, so its policies decided after the app's guards never are. Said at start-up, once per field.
 */
@ObjectType()
class Item {
  @Field(() => Int)
  id!: number;
}

@Resolver(() => Item)
class ItemResolver {
  @Query(() => [Item])
  items(): Item[] {
    return Array.from({ length: 20 }, (_, id) => ({ id }));
  }

  /** keyBy 'user': decided after the app's guards, by RateLimitInterceptor. */
  @ResolveField(() => Int)
  @RateLimit({ capacity: 3, refillPerSecond: 0.001, keyBy: 'user' })
  detail(): number {
    return 1;
  }
}

describe('a policy on a GraphQL field resolver', () => {
  const prefix = testPrefix('graphql-fields');
  const logs = new LogRecorder();
  let client: Redis;
  const apps: INestApplication[] = [];

  async function start(fieldResolverEnhancers: ('guards' | 'interceptors' | 'filters')[]): Promise<string[]> {
    @Module({
      imports: [
        RateLimitModule.forRoot({ redis: await redisUrl(), keyPrefix: prefix }),
        GraphQLModule.forRoot<ApolloDriverConfig>({ driver: ApolloDriver, autoSchemaFile: true, fieldResolverEnhancers }),
      ],
      providers: [ItemResolver],
    })
    class FieldsModule {}
    logs.clear();
    // Before init (the check runs then), after compile (which installs Nest's own logger).
    apps.push(await createApp(FieldsModule, 'express', () => Logger.overrideLogger(logs)));
    return logs.of('RateLimit', 'warn').filter((line) => line.includes('ItemResolver.detail'));
  }

  beforeAll(async () => {
    client = new Redis(await redisUrl());
  });

  afterAll(async () => {
    await Promise.all(apps.map((app) => app.close()));
    await deleteKeys(client, prefix);
    await client.quit();
    Logger.overrideLogger(false);
  });

  it("warns once at start-up, naming the field and the fix, when fieldResolverEnhancers has 'guards' without 'interceptors'", async () => {
    const warned = await start(['guards']);
    expect(warned).toEqual([
      '@RateLimit on ItemResolver.detail (a GraphQL field resolver) is not enforced: its policy ItemResolver.detail is decided after ' +
        "your guards, by RateLimitInterceptor, and GraphQLModule's fieldResolverEnhancers ['guards'] runs no interceptor on field " +
        "resolvers. Add 'interceptors' to fieldResolverEnhancers",
    ]);
  });

  it("warns when fieldResolverEnhancers is not set (no enhancer runs on a field resolver), and not with 'guards' and 'interceptors'", async () => {
    const unset = await start(undefined as never);
    expect(unset).toHaveLength(1);
    expect(unset[0]).toContain(
      "fieldResolverEnhancers (not set) runs no guard and no interceptor on field resolvers. Add 'guards' and 'interceptors'",
    );
    expect(await start(['guards', 'interceptors'])).toEqual([]);
  });
});
