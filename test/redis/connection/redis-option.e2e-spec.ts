import { Test } from '@nestjs/testing';
import { Cluster, Redis } from 'ioredis';
import { BucketService, BucketStore, RateLimitModule, type RateLimitModuleOptions, RedisBucketStore } from 'nest-redis-rate-limit';
import { RedisServer } from '../../support/redis.js';
import { wordingOf } from '../../support/start-up.js';

/**
 * The `redis` option takes a URL, ioredis RedisOptions or a client. Anything else used to connect to
 * localhost:6379 without a word; now it stops start-up with a message naming the accepted forms.
 */
const ACCEPTED = 'a redis:// or rediss:// URL string, ioredis RedisOptions or a Redis / Cluster client';
const silent = { log() {}, error() {}, warn() {} };

/** Starts a module with `redis` as the option; answers the start-up error's wording, or undefined when it started. */
async function startUp(redis: unknown): Promise<string | undefined> {
  try {
    const moduleRef = await Test.createTestingModule({
      imports: [RateLimitModule.forRoot({ redis } as RateLimitModuleOptions)],
    })
      .setLogger(silent)
      .compile();
    await moduleRef.close();
    return undefined;
  } catch (error) {
    return wordingOf(error);
  }
}

describe('the redis option', () => {
  it.each([
    ['a port number', 6380, '(got 6380)'],
    ['null', null, '(got null)'],
    ['an array', ['redis://127.0.0.1:6380'], '(got an array)'],
    ['a boolean', true, '(got true)'],
    ['a function', () => 'redis://127.0.0.1:6380', '(got a function)'],
    ['a Map', new Map([['host', '10.9.8.7']]), '(got a Map)'],
  ])('rejects %s at start-up, naming the accepted forms', async (_, redis, got) => {
    expect(await startUp(redis)).toBe(`RateLimitModule: redis must be ${ACCEPTED} ${got}`);
  });

  it.each([
    ['a string that is not a URL', 'localhost', '(got "localhost")'],
    ['an http URL', 'http://10.9.8.7:6380', '(got "http://10.9.8.7:6380")'],
  ])('rejects %s, saying a string must be a redis:// or rediss:// URL', async (_, redis, got) => {
    expect(await startUp(redis)).toBe(`RateLimitModule: redis must be a redis:// or rediss:// URL ${got}`);
  });

  it('rejects { url } and says to pass the URL itself', async () => {
    expect(await startUp({ url: 'redis://10.9.8.7:6380' })).toBe(
      'RateLimitModule: redis.url is not an ioredis option: pass the URL string itself ' +
        `(redis: "redis://10.9.8.7:6380"); redis must be ${ACCEPTED}`,
    );
  });

  it('rejects an unknown RedisOptions key and suggests the close one', async () => {
    expect(await startUp({ host: '10.9.8.7', prot: 6380 })).toBe(
      `RateLimitModule: redis.prot is not an ioredis RedisOptions key (did you mean "port"?); redis must be ${ACCEPTED}`,
    );
    expect(await startUp({ host: '10.9.8.7', passwrd: 'x' })).toContain(
      'redis.passwrd is not an ioredis RedisOptions key (did you mean "password"?)',
    );
    expect(await startUp({ hostname: '10.9.8.7' })).toContain('redis.hostname is not an ioredis RedisOptions key (did you mean "host"?)');
    expect(await startUp({ zzz: 1 })).toBe(`RateLimitModule: redis.zzz is not an ioredis RedisOptions key; redis must be ${ACCEPTED}`);
  });

  it('rejects a host or port of the wrong type', async () => {
    expect(await startUp({ host: '10.9.8.7', port: 'six' })).toBe(
      `RateLimitModule: redis.port must be a port number 1..65535, or a string of its digits (got "six"); redis must be ${ACCEPTED}`,
    );
    expect(await startUp({ host: 6380 })).toBe(
      `RateLimitModule: redis.host must be a host name or address (got 6380); redis must be ${ACCEPTED}`,
    );
  });

  it('refuses a host, port or path given as undefined (a missing environment variable) instead of connecting to localhost:6379', async () => {
    const missing = '(is an environment variable missing?)';
    expect(await startUp({ host: undefined, port: 6380 })).toBe(
      `RateLimitModule: redis.host is undefined ${missing}: give it a value, or leave host out to connect to localhost`,
    );
    expect(await startUp({ host: '10.9.8.7', port: undefined })).toBe(
      `RateLimitModule: redis.port is undefined ${missing}: give it a value, or leave port out to use 6379`,
    );
    expect(await startUp({ path: undefined })).toBe(
      `RateLimitModule: redis.path is undefined ${missing}: give it a value, or leave path out to connect over TCP`,
    );
    expect(await startUp({ sentinels: [{ host: undefined, port: 26379 }], name: 'main' })).toBe(
      `RateLimitModule: redis.sentinels[0].host is undefined ${missing}: give the sentinel's host name or address`,
    );
  });

  it('refuses redis: undefined given explicitly, as forRootAsync gives it when an environment variable is missing', async () => {
    const moduleRef = Test.createTestingModule({
      imports: [RateLimitModule.forRootAsync({ useFactory: () => ({ redis: process.env.RL_TEST_NO_SUCH_VARIABLE }) })],
    }).setLogger(silent);
    await expect(moduleRef.compile()).rejects.toThrow(
      'RateLimitModule: redis is undefined (is an environment variable missing?): give a redis:// URL, RedisOptions or a client, ' +
        'or leave redis out to connect to redis://127.0.0.1:6379',
    );
  });

  it('checks a port the same way in options and in sentinels: digits only, 1..65535', async () => {
    const port = (got: string, where = 'redis.port') =>
      `RateLimitModule: ${where} must be a port number 1..65535, or a string of its digits (got ${got}); redis must be ${ACCEPTED}`;
    expect(await startUp({ host: '10.9.8.7', port: '6380x' })).toBe(port('"6380x"'));
    expect(await startUp({ host: '10.9.8.7', port: ' 6380' })).toBe(port('" 6380"'));
    expect(await startUp({ host: '10.9.8.7', port: '0' })).toBe(port('"0"'));
    expect(await startUp({ host: '10.9.8.7', port: 0 })).toBe(port('0'));
    expect(await startUp({ sentinels: [{ host: 's1', port: 'x26379' }], name: 'main' })).toBe(port('"x26379"', 'redis.sentinels[0].port'));
    expect(await startUp({ sentinels: [{ host: 's1', prot: 26379 }], name: 'main' })).toBe(
      `RateLimitModule: unknown key "prot" in redis.sentinels[0] (did you mean "port"?); redis must be ${ACCEPTED}`,
    );
  });

  it('never shows the password of a URL it rejects', async () => {
    const message = await startUp('http://admin:S3cret@10.9.8.7:6380/0');
    expect(message).toBe('RateLimitModule: redis must be a redis:// or rediss:// URL (got "http://admin:***@10.9.8.7:6380/0")');
    const inUrlOption = await startUp({ url: 'redis://:S3cret@10.9.8.7:6380?password=Other' });
    expect(inUrlOption).toContain('(redis: "redis://:***@10.9.8.7:6380?password=***")');
    for (const text of [message, inUrlOption]) {
      expect(text).not.toContain('S3cret');
      expect(text).not.toContain('Other');
    }
  });

  describe('accepts every documented form', () => {
    let server: RedisServer;
    beforeAll(async () => {
      server = await RedisServer.start();
    });
    afterAll(async () => {
      await server?.stop();
    });

    /** Starts the module with `redis` and takes a token through it: proof it reached this test's server. */
    async function decidesThrough(redis: RateLimitModuleOptions['redis']): Promise<string> {
      const moduleRef = await Test.createTestingModule({
        imports: [RateLimitModule.forRoot({ redis, failureMode: 'closed', timeoutMs: 1000 })],
      })
        .setLogger(silent)
        .compile();
      await moduleRef.init();
      try {
        const decision = await moduleRef.get(BucketService).consume('redis-option-form', { capacity: 5, refillPerSecond: 1 });
        return `${decision.allowed}:${decision.remaining}`;
      } finally {
        await moduleRef.close();
      }
    }

    it('a URL, RedisOptions (with the keys ioredis knows) and a client all reach the server given', async () => {
      const check = new Redis(server.url);
      try {
        expect(await decidesThrough(server.url)).toBe('true:4');
        expect(await decidesThrough({ host: '127.0.0.1', port: server.port, db: 0, connectionName: 'rl', keepAlive: 1000 })).toBe('true:3');
        // An environment variable's port, as a string of digits, is that port (as in a URL).
        expect(await decidesThrough({ host: '127.0.0.1', port: String(server.port) as unknown as number })).toBe('true:2');
        const client = new Redis(server.url, { enableOfflineQueue: false });
        await new Promise((resolve) => client.once('ready', resolve));
        expect(await decidesThrough(client)).toBe('true:1');
        expect(client.status).toBe('ready');
        client.disconnect();
        expect(await check.exists('rl:{redis-option-form}')).toBe(1);
      } finally {
        check.disconnect();
      }
    });

    it('takes a Cluster instance as a client as it is: its options unchecked and unchanged, no listener added, left open', async () => {
      // ClusterOptions that are no RedisOptions: given as the redis option's object they are refused as unknown keys.
      const clusterOnly = { scaleReads: 'master', clusterRetryStrategy: () => null } as const;
      expect(await startUp({ host: '127.0.0.1', port: server.port, ...clusterOnly })).toBe(
        `RateLimitModule: redis.scaleReads is not an ioredis RedisOptions key; redis must be ${ACCEPTED}`,
      );
      const warnings: string[] = [];
      const recording = { ...silent, warn: (message: unknown) => warnings.push(String(message)) };
      const listened = (client: Cluster) => client.eventNames().map((name) => `${String(name)}:${client.listenerCount(name)}`);

      const cluster = new Cluster([{ host: '127.0.0.1', port: server.port }], {
        lazyConnect: true,
        enableOfflineQueue: false,
        ...clusterOnly,
      });
      const listenersBefore = listened(cluster);
      const moduleRef = await Test.createTestingModule({ imports: [RateLimitModule.forRoot({ redis: cluster })] })
        .setLogger(recording)
        .compile();
      try {
        const store = moduleRef.get(BucketStore);
        expect(store).toBeInstanceOf(RedisBucketStore);
        // This very client, routed by slot (a Cluster), with no option changed and no listener of the module.
        expect((store as RedisBucketStore).client).toBe(cluster);
        expect((store as RedisBucketStore).nodeOf).toBeInstanceOf(Function);
        expect(cluster.options).toMatchObject({ lazyConnect: true, enableOfflineQueue: false, scaleReads: 'master' });
        expect(cluster.options.clusterRetryStrategy).toBe(clusterOnly.clusterRetryStrategy);
        expect(listened(cluster)).toEqual(listenersBefore);
        expect(warnings).toEqual([]);
      } finally {
        await moduleRef.close();
      }
      // The application's client: neither connected by the module's build nor closed by its shutdown.
      expect(cluster.status).toBe('wait');
      cluster.disconnect();

      // A Cluster that queues commands while disconnected is taken too, with the warning a Redis client gets.
      const queueing = new Cluster([{ host: '127.0.0.1', port: server.port }], { lazyConnect: true });
      const queued = await Test.createTestingModule({ imports: [RateLimitModule.forRoot({ redis: queueing })] })
        .setLogger(recording)
        .compile();
      await queued.close();
      queueing.disconnect();
      expect(warnings).toEqual([expect.stringContaining('create it with { enableOfflineQueue: false }')]);
    });
  });
});
