import { Logger, type INestApplication } from '@nestjs/common';
import { Redis } from 'ioredis';
import { deleteKeys, redisUrl, testPrefix } from './redis.js';

/** What `redisScenario` gives a describe block. */
export interface RedisScenario {
  /** The file's own key prefix: every key its apps write is under it, and deleted after the file. */
  readonly prefix: string;
  /** A client on the run's Redis, to read what the apps stored (from the first test on). */
  readonly client: Redis;
  /** The apps the block started: closed after it. */
  readonly apps: INestApplication[];
  /** A key prefix under `prefix` that no other app of the block uses, for the next app. */
  nextKeyPrefix(): string;
  /** Keeps `app` to close it after the block, and answers it. */
  track<App extends INestApplication>(app: App): App;
}

/**
 * The set-up most e2e files repeat, in one place: a key prefix of the block's own, a Redis client to
 * look at the stored buckets, and at the end every app closed, the block's keys deleted (never a FLUSH:
 * the server is shared) and the client closed. `restoreLogger` also turns Nest's logger off again, for
 * blocks that record it with `Logger.overrideLogger`. Call it directly inside a `describe`.
 */
export function redisScenario(name: string, { restoreLogger = false }: { restoreLogger?: boolean } = {}): RedisScenario {
  const prefix = testPrefix(name);
  const apps: INestApplication[] = [];
  let client: Redis | undefined;
  let started = 0;
  beforeAll(async () => {
    client = new Redis(await redisUrl());
  });
  afterAll(async () => {
    await Promise.all(apps.map((app) => app.close()));
    if (client) {
      await deleteKeys(client, prefix);
      await client.quit();
    }
    if (restoreLogger) Logger.overrideLogger(false);
  });
  return {
    prefix,
    get client(): Redis {
      if (!client) throw new Error('redisScenario: the client exists from beforeAll on');
      return client;
    },
    apps,
    nextKeyPrefix: () => `${prefix}${started++}:`,
    track: (app) => {
      apps.push(app);
      return app;
    },
  };
}
