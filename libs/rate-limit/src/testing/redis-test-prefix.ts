import { randomUUID } from 'node:crypto';
import { type Cluster, Redis } from 'ioredis';
import { RateLimitConfigError } from '../errors/rate-limit.errors.js';
import { isRedisClient } from '../stores/redis/redis-options.validation.js';

/** Options of `createRedisTestPrefix`. */
export interface RedisTestPrefixOptions {
  /**
   * A readable part of the prefix, to tell whose keys are whose when looking at the server (the test file's
   * name, say): 1 to 40 characters of A-Z a-z 0-9 . _ : -. Default `'test'`.
   */
  name?: string;
}

/** A key prefix of a test's own on a Redis server, and the means to remove what was written under it. */
export interface RedisTestPrefix {
  /** `test:<name>:<12 random hex digits>:`, for `RateLimitModule.forRoot({ keyPrefix })`: no other run shares it. */
  readonly keyPrefix: string;
  /**
   * Removes every key whose name starts with `keyPrefix` (SCAN ... MATCH, then UNLINK; nothing outside
   * the prefix is touched, so a shared server keeps everything else) and resolves with how many it removed. On a Cluster
   * client it scans every master. Call it once the app that wrote the keys is closed (`app.close()`); it can
   * be called again.
   */
  cleanup(): Promise<number>;
}

const NAME = /^[\w.:-]{1,40}$/;

/** `*`, `?`, `[`, `]` and `\` match themselves in a SCAN pattern only when escaped. */
function matchPattern(prefix: string): string {
  return `${prefix.replaceAll(/[*?[\]\\]/g, '\\$&')}*`;
}

/** Keys per SCAN step (a hint to Redis) and per UNLINK. */
const BATCH = 500;

/** Scans one server for the keys under `prefix` and unlinks them; `unlink` decides how (one command, or one per key). */
async function removeFrom(node: Redis, prefix: string, unlink: (keys: string[]) => Promise<unknown>): Promise<number> {
  let removed = 0;
  let cursor = '0';
  do {
    const [next, keys] = await node.scan(cursor, 'MATCH', matchPattern(prefix), 'COUNT', BATCH);
    cursor = next;
    if (keys.length > 0) {
      await unlink(keys);
      removed += keys.length;
    }
  } while (cursor !== '0');
  return removed;
}

function messageOf(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

/** The URL with `***` for its password, for a message. */
function withoutPassword(url: string): string {
  return url.replace(/^(rediss?:\/\/[^:@/]*:)[^@/]*@/, '$1***@');
}

function isCluster(client: Redis | Cluster): client is Cluster {
  return (client as { isCluster?: boolean }).isCluster === true;
}

async function removeKeys(client: Redis | Cluster, prefix: string): Promise<number> {
  if (!isCluster(client)) return removeFrom(client, prefix, (keys) => client.unlink(...keys));
  // A Cluster: every master holds some of the keys. Keys of different slots cannot share one UNLINK, so each
  // key is unlinked on its own, through the Cluster client (which routes it to its slot's master).
  let removed = 0;
  for (const master of client.nodes('master')) {
    removed += await removeFrom(master, prefix, (keys) => Promise.all(keys.map((key) => client.unlink(key))));
  }
  return removed;
}

/**
 * A key prefix of the test's own, and `cleanup()`, which removes the keys written under it: for tests that
 * run the module against a real Redis shared with other tests, other runs or other people, so that no count
 * carries over from one test to the next and nothing is left behind.
 *
 * `redis` is a `redis://` or `rediss://` URL (`cleanup()` opens a connection of its own, and closes it when
 * done) or an ioredis `Redis` or `Cluster` client (used as it is, and left open: you close it). A client
 * created with ioredis' own `keyPrefix` option is refused: the keys SCAN returns would be prefixed twice.
 *
 * On a Cluster, `cleanup()` scans each master the client knows when it is called; a key that moves to
 * another node during the scan (a resharding) may be missed.
 */
export function createRedisTestPrefix(redis: string | Redis | Cluster, options: RedisTestPrefixOptions = {}): RedisTestPrefix {
  const name = options.name ?? 'test';
  if (typeof name !== 'string' || !NAME.test(name)) {
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_INVALID_OPTION',
      `createRedisTestPrefix: name must be 1-40 characters of A-Z a-z 0-9 . _ : - (got ${JSON.stringify(name)})`,
    );
  }
  const url = typeof redis === 'string' && /^rediss?:\/\//.test(redis);
  if (!url && !isRedisClient(redis)) {
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_INVALID_REDIS_OPTION',
      `createRedisTestPrefix: redis must be a redis:// or rediss:// URL or an ioredis Redis or Cluster client (got ${typeof redis === 'string' ? JSON.stringify(redis) : typeof redis})`,
    );
  }
  if (!url && (redis as { options?: { keyPrefix?: string } }).options?.keyPrefix) {
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_INVALID_REDIS_OPTION',
      "createRedisTestPrefix: the client has ioredis' own keyPrefix option set, which would prefix the keys it removes a second time; pass a client without it",
    );
  }
  const keyPrefix = `test:${name}:${randomUUID().replaceAll('-', '').slice(0, 12)}:`;
  return {
    keyPrefix,
    async cleanup() {
      if (!url) return removeKeys(redis as Redis | Cluster, keyPrefix);
      // No retries: an unreachable server fails the cleanup at once instead of leaving it waiting.
      const client = new Redis(redis, {
        lazyConnect: true,
        maxRetriesPerRequest: 0,
        retryStrategy: () => null,
        // Seen in CLIENT LIST while it runs.
        connectionName: `createRedisTestPrefix:${keyPrefix}`,
      });
      // ioredis reports why a connection failed as an 'error' event; connect() only says it closed.
      let cause: unknown;
      client.on('error', (error: unknown) => (cause ??= error));
      try {
        await client.connect().catch((error: unknown) => {
          cause ??= error;
          throw new Error(
            `createRedisTestPrefix: cleanup() could not connect to ${withoutPassword(redis as string)}: ${messageOf(cause)}`,
            {
              cause,
            },
          );
        });
        return await removeKeys(client, keyPrefix);
      } finally {
        client.disconnect();
      }
    },
  };
}
