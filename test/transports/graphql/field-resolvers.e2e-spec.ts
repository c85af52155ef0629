import { type INestApplication, Logger, Module } from '@nestjs/common';
import { ApolloDriver, type ApolloDriverConfig } from '@nestjs/apollo';
import { Field, GraphQLModule, Int, ObjectType, Query, ResolveField, Resolver } from '@nestjs/graphql';
import { Redis } from 'ioredis';
import { ConcurrencyLimit, RateLimit, RateLimitModule } from 'nest-redis-rate-limit';
import { createApp } from '../../support/app.js';
import { LogRecorder } from '../../support/log-recorder.js';
import { deleteKeys, redisUrl, testPrefix } from '../../support/redis.js';

/**
 * Issue 22, finding 8, and issue 32, item 5: Nest runs on a field resolver only the enhancers of
 * `fieldResolverEnhancers`. With `['guards']` alone the policies decided after the app's guards (here
 * a keyBy function's) never were: 20 items resolved where the policy allows 3, with only a warning.
 * Now such a field resolver stops the start (ERR_RATE_LIMIT_FIELD_RESOLVER_UNENFORCED), as does a
 * @RateLimit on a field resolver when no enhancer runs there; with 'interceptors' every policy of the
 * field is enforced, item by item. Policies a field resolver only inherits (its class's) while no
 * enhancer runs there are named in a warning, and the app starts.
 */
const SLOW = 0.001;

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

  /** keyBy a function: decided after the app's guards, by RateLimitInterceptor. */
  @ResolveField(() => Int, { nullable: true })
  @RateLimit({ capacity: 3, refillPerSecond: SLOW, keyBy: () => 'tenant-a' })
  detail(): number {
    return 1;
  }
}

@ObjectType()
class Job {
  @Field(() => Int)
  id!: number;
}

@Resolver(() => Job)
class JobResolver {
  @Query(() => [Job])
  jobs(): Job[] {
    return Array.from({ length: 3 }, (_, id) => ({ id }));
  }

  /** A concurrency limit: its slot is taken by RateLimitInterceptor alone. */
  @ResolveField(() => Int, { nullable: true })
  @ConcurrencyLimit(1)
  progress(): number {
    return 1;
  }
}

@ObjectType()
class Place {
  @Field(() => Int)
  id!: number;
}

@Resolver(() => Place)
class PlaceResolver {
  @Query(() => [Place])
  places(): Place[] {
    return Array.from({ length: 20 }, (_, id) => ({ id }));
  }

  /** keyBy 'ip': decided before the app's guards, by RateLimitGuard. */
  @ResolveField(() => Int, { nullable: true })
  @RateLimit({ capacity: 3, refillPerSecond: SLOW, keyBy: 'ip' })
  distance(): number {
    return 1;
  }
}

@ObjectType()
class Book {
  @Field(() => Int)
  id!: number;
}

/** A class policy, meant for its query; the field resolver only inherits it. */
@Resolver(() => Book)
@RateLimit({ capacity: 5, refillPerSecond: SLOW, keyBy: () => 'library' })
class BookResolver {
  @Query(() => [Book])
  books(): Book[] {
    return Array.from({ length: 2 }, (_, id) => ({ id }));
  }

  @ResolveField(() => Int, { nullable: true })
  pages(): number {
    return 100;
  }
}

type Enhancers = ('guards' | 'interceptors' | 'filters')[] | undefined;

describe('a policy on a GraphQL field resolver', () => {
  const prefix = testPrefix('graphql-fields');
  const logs = new LogRecorder();
  let client: Redis;
  const apps: INestApplication[] = [];
  let runs = 0;

  /** Starts an app with `resolvers` (each app its own key prefix): the app, or the start-up error. */
  async function start(fieldResolverEnhancers: Enhancers, resolvers: Function[]): Promise<{ app?: INestApplication; error?: unknown }> {
    @Module({
      imports: [
        RateLimitModule.forRoot({ redis: await redisUrl(), keyPrefix: `${prefix}${runs++}:` }),
        GraphQLModule.forRoot<ApolloDriverConfig>({ driver: ApolloDriver, autoSchemaFile: true, fieldResolverEnhancers }),
      ],
      providers: resolvers as never[],
    })
    class FieldsModule {}
    logs.clear();
    try {
      // Before init (the check runs then), after compile (which installs Nest's own logger).
      const app = await createApp(FieldsModule, 'express', () => Logger.overrideLogger(logs));
      apps.push(app);
      await app.listen(0, '127.0.0.1');
      return { app };
    } catch (error) {
      return { error };
    }
  }

  /** Posts `query` and answers how many of `list`'s 20 items got their `field` (the others were refused). */
  async function resolved(app: INestApplication, list: string, field: string): Promise<number> {
    const response = await fetch(`${await app.getUrl()}/graphql`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ query: `{ ${list} { id ${field} } }` }),
    });
    const body = (await response.json()) as { data: Record<string, Record<string, unknown>[]> };
    return body.data[list].filter((item) => item[field] !== null).length;
  }

  const fieldWarnings = (route: string) => logs.of('RateLimit', 'warn').filter((line) => line.includes(route));

  beforeAll(async () => {
    client = new Redis(await redisUrl());
  });

  afterAll(async () => {
    await Promise.all(apps.map((app) => app.close()));
    await deleteKeys(client, prefix);
    await client.quit();
    Logger.overrideLogger(false);
  });

  it("stops the start with 'guards' alone when a policy of the field is decided after the guards (it let 20 of 3 through)", async () => {
    const { app, error } = await start(['guards'], [ItemResolver]);
    expect(app).toBeUndefined();
    expect(error).toMatchObject({
      name: 'RateLimitConfigError',
      code: 'ERR_RATE_LIMIT_FIELD_RESOLVER_UNENFORCED',
      reason:
        '@RateLimit on ItemResolver.detail (a GraphQL field resolver) would be enforced only in part: its policy ItemResolver.detail ' +
        "is decided after your guards, by RateLimitInterceptor, and GraphQLModule's fieldResolverEnhancers ['guards'] runs no " +
        "interceptor on field resolvers. Add 'interceptors' to fieldResolverEnhancers, or put @SkipRateLimit() on the field resolver",
    });
  });

  it("stops the start when a field resolver's @ConcurrencyLimit would run without RateLimitInterceptor, 'guards' or not", async () => {
    for (const enhancers of [['guards'], undefined] as Enhancers[]) {
      const { app, error } = await start(enhancers, [JobResolver]);
      expect(app).toBeUndefined();
      expect(error).toMatchObject({
        code: 'ERR_RATE_LIMIT_FIELD_RESOLVER_UNENFORCED',
        reason: expect.stringMatching(
          /^@ConcurrencyLimit on JobResolver\.progress \(a GraphQL field resolver\) would never be enforced: .* runs no interceptor on field resolvers\. Add 'interceptors'/,
        ),
      });
    }
    const { app, error } = await start(['guards', 'interceptors'], [JobResolver]);
    expect(error).toBeUndefined();
    await app?.close();
  });

  it('stops the start when no enhancer runs on field resolvers and one has a @RateLimit of its own', async () => {
    const { error } = await start(undefined, [ItemResolver]);
    expect(error).toMatchObject({
      code: 'ERR_RATE_LIMIT_FIELD_RESOLVER_UNENFORCED',
      reason:
        "@RateLimit on ItemResolver.detail (a GraphQL field resolver) would never be enforced: GraphQLModule's fieldResolverEnhancers " +
        "(not set) runs no guard and no interceptor on field resolvers. Add 'guards' and 'interceptors' to fieldResolverEnhancers, " +
        'or remove the @RateLimit',
    });
    // Both field resolvers named: the first, and how many more.
    const both = await start([], [ItemResolver, PlaceResolver]);
    expect((both.error as { reason: string }).reason).toMatch(
      /fieldResolverEnhancers \[\] runs no guard .* \(and 1 more field resolver alike\)$/,
    );
  });

  it.each([[['guards', 'interceptors']], [['interceptors']]] as Enhancers[][])(
    'enforces the keyBy function policy item by item with %j: 3 of 20 items resolved',
    async (enhancers) => {
      const { app, error } = await start(enhancers, [ItemResolver]);
      expect(error).toBeUndefined();
      expect(await resolved(app!, 'items', 'detail')).toBe(3);
      expect(await resolved(app!, 'items', 'detail')).toBe(0);
    },
  );

  it("starts with 'guards' alone when every policy of the field is decided by the guard, and enforces it: 3 of 20", async () => {
    const { app, error } = await start(['guards'], [PlaceResolver]);
    expect(error).toBeUndefined();
    expect(fieldWarnings('PlaceResolver.distance')).toEqual([]);
    expect(await resolved(app!, 'places', 'distance')).toBe(3);
  });

  it('starts when a field resolver only inherits its class policy and no enhancer runs there, and says so once', async () => {
    const { app, error } = await start(undefined, [BookResolver]);
    expect(error).toBeUndefined();
    expect(fieldWarnings('BookResolver.pages')).toEqual([
      "@RateLimit on BookResolver.pages (a GraphQL field resolver) is not enforced: the policies it takes from its class or the module's " +
        "defaults apply to queries and mutations, and GraphQLModule's fieldResolverEnhancers (not set) runs no guard and no interceptor " +
        "on field resolvers. Add 'guards' and 'interceptors' to fieldResolverEnhancers to limit the field too, or put @SkipRateLimit() on it",
    ]);
    // The class policy (5 by one key) limits the query, and takes nothing per field: 5 queries resolve
    // both books' pages, the 6th is refused.
    for (let i = 0; i < 5; i++) expect(await resolved(app!, 'books', 'pages')).toBe(2);
    const refused = await fetch(`${await app!.getUrl()}/graphql`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ query: '{ books { id pages } }' }),
    });
    expect(await refused.json()).toMatchObject({ data: null, errors: [{ extensions: { code: 'RATE_LIMITED' } }] });
  });
});
