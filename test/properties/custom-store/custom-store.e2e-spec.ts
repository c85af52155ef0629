import { Controller, Get, Injectable, type INestApplication, Module } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { Redis } from 'ioredis';
import {
  BucketService,
  type BucketStore,
  MemoryBucketStore,
  RateLimit,
  RateLimitModule,
  type RateLimitModuleOptions,
  RedisBucketStore,
  type TakeOptions,
  type TakeResult,
} from 'nest-redis-rate-limit';
import request from 'supertest';
import type { BucketRequest } from '../../../libs/rate-limit/src/stores/token-bucket.js';
import { createApp } from '../../support/app.js';
import { deleteKeys, redisUrl, testPrefix } from '../../support/redis.js';
import { startUp } from '../../support/start-up.js';

/**
 * `store:` takes a `BucketStore` of the application's own (issue 21, item 3): the guard's decisions are
 * the store's; a remote one gets the deadline and `failureMode`, a local one is called directly; a store
 * that lacks a member stops the start naming it.
 */

/** A store of one's own: the memory store (or any other) behind a counter of calls, which can be made to fail. */
class CountingStore implements BucketStore {
  readonly takes: { keys: string[]; options: TakeOptions }[] = [];
  deletes = 0;
  destroyed = 0;
  /** While set, every call rejects with it (the store's backend is down). */
  failure: Error | undefined;

  constructor(
    private readonly inner: BucketStore,
    readonly remote: boolean,
  ) {}

  async take(requests: readonly BucketRequest[], options: TakeOptions = {}): Promise<TakeResult> {
    this.takes.push({ keys: requests.map((r) => r.key), options });
    if (this.failure) throw this.failure;
    return this.inner.take(requests, options);
  }

  async delete(keys: readonly string[]): Promise<void> {
    this.deletes++;
    if (this.failure) throw this.failure;
    return this.inner.delete(keys);
  }

  /** The module must leave a store it was given alone: the application owns it (as a client it passes in). */
  onModuleDestroy(): void {
    this.destroyed++;
  }
}

@Controller('reports')
class ReportsController {
  @Get()
  @RateLimit({ capacity: 2, refillPerSecond: 0.001, name: 'reports' })
  list() {
    return ['r1'];
  }
}

function appModule(options: RateLimitModuleOptions) {
  @Module({ imports: [RateLimitModule.forRoot(options)], controllers: [ReportsController] })
  class CustomStoreAppModule {}
  return CustomStoreAppModule;
}

async function statuses(app: INestApplication, n: number): Promise<[number, string | undefined][]> {
  const out: [number, string | undefined][] = [];
  for (let i = 0; i < n; i++) {
    const response = await request(app.getHttpServer()).get('/reports');
    out.push([response.status, response.headers['x-ratelimit-remaining'] as string | undefined]);
  }
  return out;
}

describe('store: a BucketStore of your own', () => {
  const prefix = testPrefix('custom-store');
  let client: Redis;

  beforeAll(async () => {
    client = new Redis(await redisUrl(), { enableOfflineQueue: false, lazyConnect: true });
    await client.connect();
  });

  afterAll(async () => {
    await deleteKeys(client, prefix);
    await client.quit();
  });

  it('decides every request of the app through the store given (a counting wrapper of the memory store), and leaves its lifecycle to the app', async () => {
    const store = new CountingStore(new MemoryBucketStore(), false);
    const app = await createApp(appModule({ store, keyPrefix: `${prefix}local:` }), 'express');
    try {
      expect(await statuses(app, 3)).toEqual([
        [200, '1'],
        [200, '0'],
        [429, '0'],
      ]);
      expect(store.takes.map((t) => t.keys)).toEqual([
        [`${prefix}local:{ip:127.0.0.1}:reports`],
        [`${prefix}local:{ip:127.0.0.1}:reports`],
        [`${prefix}local:{ip:127.0.0.1}:reports`],
      ]);
      // Local (remote: false): called directly, without a deadline's `sent`.
      expect(store.takes.map((t) => t.options.sent)).toEqual([undefined, undefined, undefined]);
    } finally {
      await app.close();
    }
    expect(store.destroyed).toBe(0);
  });

  it.each([
    ['closed', [503, 503]],
    ['open', [200, 200]],
  ] as const)(
    "a remote store that throws follows failureMode '%s'; when it answers again, Redis behind it decides again",
    async (failureMode, whileBroken) => {
      const keyPrefix = `${prefix}remote-${failureMode}:`;
      const store = new CountingStore(new RedisBucketStore(client, false), true);
      const app = await createApp(appModule({ store, keyPrefix, failureMode }), 'express');
      try {
        expect(await statuses(app, 1)).toEqual([[200, '1']]);
        store.failure = new Error('backend down');
        expect((await statuses(app, 2)).map(([status]) => status)).toEqual(whileBroken);
        store.failure = undefined;
        expect(await statuses(app, 2)).toEqual([
          [200, '0'],
          [429, '0'],
        ]);
        // Remote: every call was handed a `sent` (the deadline runs from it); the bucket lives in Redis.
        expect(store.takes.every((t) => typeof t.options.sent === 'function')).toBe(true);
        // Two taken, a few ms of refill at 0.001/s: whole tokens 0.
        expect(Math.floor(Number(await client.hget(`${keyPrefix}{ip:127.0.0.1}:reports`, 'tokens')))).toBe(0);
      } finally {
        await app.close();
      }
    },
  );

  it("a remote store that never answers (and never calls sent) is timed out after timeoutMs and follows failureMode 'local'", async () => {
    const hung: BucketStore = { remote: true, take: () => new Promise(() => {}), delete: () => Promise.resolve() };
    const app = await createApp(appModule({ store: hung, keyPrefix: `${prefix}hung:`, failureMode: 'local', timeoutMs: 50 }), 'express');
    try {
      expect(await statuses(app, 3)).toEqual([
        [200, '1'],
        [200, '0'],
        [429, '0'],
      ]);
    } finally {
      await app.close();
    }
  });

  it.each([
    ['a reply without tokens', () => Promise.resolve({ allowed: true })],
    [
      'one that throws synchronously',
      () => {
        throw new Error('not async');
      },
    ],
  ])("a local store answering %s follows failureMode 'closed' (503): a malformed reply is a failed call", async (_what, take) => {
    const odd = { remote: false, take, delete: () => Promise.resolve() } as unknown as BucketStore;
    const app = await createApp(appModule({ store: odd, keyPrefix: `${prefix}odd:`, failureMode: 'closed' }), 'express');
    try {
      expect(await statuses(app, 2)).toEqual([
        [503, undefined],
        [503, undefined],
      ]);
    } finally {
      await app.close();
    }
  });

  it('works from forRootAsync with isGlobal: a feature module consumes through the store the factory returned', async () => {
    const store = new CountingStore(new MemoryBucketStore(), false);
    @Injectable()
    class Quota {
      constructor(readonly buckets: BucketService) {}
    }
    @Module({ providers: [Quota], exports: [Quota] })
    class FeatureModule {}
    const moduleRef = await Test.createTestingModule({
      imports: [
        RateLimitModule.forRootAsync({ isGlobal: true, useFactory: async () => ({ store, keyPrefix: `${prefix}async:` }) }),
        FeatureModule,
      ],
    }).compile();
    await moduleRef.init();
    try {
      const quota = moduleRef.get(Quota);
      const policy = { capacity: 1, refillPerSecond: 0.001 };
      expect((await quota.buckets.consume('export', policy)).allowed).toBe(true);
      expect((await quota.buckets.consume('export', policy)).allowed).toBe(false);
      await quota.buckets.reset('export');
      expect((await quota.buckets.consume('export', policy)).allowed).toBe(true);
      expect([store.takes.length, store.deletes]).toEqual([3, 1]);
    } finally {
      await moduleRef.close();
    }
  });
});

describe('a store that is not a BucketStore stops the start, naming what is missing', () => {
  const take = () => Promise.resolve({ allowed: true, tokens: [] });
  const del = () => Promise.resolve();
  it.each([
    [{}, 'take(), delete() and remote (true or false)'],
    [{ take, delete: del }, 'remote (true or false)'],
    [{ take, remote: true }, 'delete()'],
    [{ take: 'yes', delete: del, remote: 'no' }, 'take() and remote (true or false)'],
    [{ take, delete: del, remote: true, nodeOf: 'a' }, 'nodeOf() as a function'],
  ])('store %j lacks %s', async (store, missing) => {
    expect(await startUp(appModule({ store: store as unknown as BucketStore }))).toEqual({
      phase: 'compile',
      message: `RateLimitModule: store must be 'redis', 'memory' or a BucketStore; the object given lacks ${missing}`,
    });
  });

  it.each([[null], [42], ['postgres'], [[]]])('store %j is refused', async (store) => {
    expect(await startUp(appModule({ store: store as unknown as BucketStore }))).toEqual({
      phase: 'compile',
      message: `RateLimitModule: store must be 'redis', 'memory' or a BucketStore (an object with take(), delete() and remote) (got ${JSON.stringify(store)})`,
    });
  });

  it('refuses redis beside a store of your own: the store holds its own connection, the option would be ignored', async () => {
    const store = new CountingStore(new MemoryBucketStore(), false);
    expect(await startUp(appModule({ store, redis: 'redis://127.0.0.1:6379' }))).toEqual({
      phase: 'compile',
      message:
        'RateLimitModule: redis is not read with a BucketStore of your own (store: <object>): the store holds its own connection; remove redis',
    });
  });
});
