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
  { redisArgs = [], serverDown = false, inspect = false, configure }: OwnRedisOptions = {},
): OwnRedisApp {
  const fixture = {} as OwnRedisApp;

  beforeAll(async () => {
    fixture.server = await RedisServer.start(redisArgs);
    if (serverDown) await fixture.server.stop();
    if (inspect) fixture.client = await inspector(fixture.server.url);
    const started = performance.now();
    fixture.app = await createApp(failureAppModule({ ...options, redis: fixture.server.url }), platform, configure);
    fixture.startUpMs = performance.now() - started;
    fixture.url = await limitedUrl(fixture.app);
  });

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
