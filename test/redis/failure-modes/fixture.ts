import { performance } from 'node:perf_hooks';
import type { INestApplication } from '@nestjs/common';
import type { Redis } from 'ioredis';
import type { RateLimitModuleOptions } from 'nest-redis-rate-limit';
import { createApp, type Platform } from '../../support/app.js';
import { stopAllLoads } from '../../support/load.js';
import { RedisServer } from '../../support/redis.js';
import { failureAppModule } from './app.module.js';
import { inspector, limitedUrl } from './scenario.js';

/** What a suite's tests use; filled in by its beforeAll. */
export interface OwnRedisApp {
  /** A redis-server of the suite's own, on a free port: its tests may freeze, kill and restart it. */
  server: RedisServer;
  app: INestApplication;
  /** The limited route, warmed up (`limitedUrl`). */
  url: string;
  /** How long the app took to start (createApp). */
  startUpMs: number;
  /** A client for inspecting the server: connected by `inspect`, or set by a test; the teardown disconnects it. */
  client: Redis;
}

export interface OwnRedisOptions {
  /** More `redis-server` arguments, e.g. `['--enable-debug-command', 'yes']`. */
  redisArgs?: string[];
  /** Stop the server again before the app starts: its port stays free until a test starts it. */
  serverDown?: boolean;
  /** Connect `client` before the app starts. */
  inspect?: boolean;
  /** Passed to createApp, before init (e.g. a logger). */
  configure?: (app: INestApplication) => void;
  /** Set up in the file's `startTogether()` hook, at once with the other fixtures given it, not in the block's own. */
  together?: StartTogether;
}

/** Collects set-ups to run at once (`startTogether`). */
export interface StartTogether {
  add(start: () => Promise<void>): void;
}

/**
 * Registers, in the current (outer) block, a beforeAll that runs at once every set-up given to it by
 * the `appOnOwnRedis` calls of the blocks inside (option `together`), each its own redis-server and app.
 * Most of a set-up is waiting (a server starting, an app connecting), so six of them take about as long
 * as one. Their tests still run one at a time, and each block's teardown still closes its own app and
 * server after its tests. Fails with the first set-up's failure, after all of them settled (the
 * teardowns stop what did start). Not for `configure` (Nest's logger is one per process: apps set up at
 * once would log to the last one's) nor `serverDown` (an app would wait for its server through the other
 * blocks' tests, its reconnect back-off growing): `appOnOwnRedis` refuses both with `together`.
 */
export function startTogether(): StartTogether {
  const starts: (() => Promise<void>)[] = [];
  beforeAll(async () => {
    const settled = await Promise.allSettled(starts.map((start) => start()));
    const failed = settled.find((result): result is PromiseRejectedResult => result.status === 'rejected');
    if (failed) throw failed.reason;
  }, 60_000);
  return { add: (start) => starts.push(start) };
}

/**
 * Registers the current describe block's beforeAll / afterAll: a redis-server of its own, then the
 * failure-mode app on `platform` connected to it with `options`. The teardown runs even when a test or
 * the set-up failed: load loops stopped, the app closed, the client disconnected, and in any case the
 * server killed (SIGCONT first, so a frozen one dies too).
 */
export function appOnOwnRedis(
  platform: Platform,
  options: Omit<RateLimitModuleOptions, 'redis'>,
  { redisArgs = [], serverDown = false, inspect = false, configure, together }: OwnRedisOptions = {},
): OwnRedisApp {
  const fixture = {} as OwnRedisApp;
  if (together && (configure || serverDown))
    throw new Error('appOnOwnRedis: `together` is not for `configure` or `serverDown` (see startTogether)');

  const start = async () => {
    fixture.server = await RedisServer.start(redisArgs);
    if (serverDown) await fixture.server.stop();
    if (inspect) fixture.client = await inspector(fixture.server.url);
    const started = performance.now();
    fixture.app = await createApp(failureAppModule({ ...options, redis: fixture.server.url }), platform, configure);
    fixture.startUpMs = performance.now() - started;
    fixture.url = await limitedUrl(fixture.app);
  };
  if (together) together.add(start);
  else beforeAll(start);

  afterAll(async () => {
    try {
      stopAllLoads();
      await fixture.app?.close();
    } finally {
      fixture.client?.disconnect();
      // The server keeps nothing on disk: killing it removes every key it held.
      await fixture.server?.stop();
    }
  });

  return fixture;
}
