import { Test } from '@nestjs/testing';
import { Cluster, Redis } from 'ioredis';
import { BucketService, RateLimitModule, type RateLimitModuleOptions } from 'nest-redis-rate-limit';
import { RedisServer } from '../support/redis.js';

/**
 * The `redis` option takes a URL, ioredis RedisOptions or a client. Anything else used to connect to
 * localhost:6379 without a word; now it stops start-up with a message naming the accepted forms.
 */
const ACCEPTED = 'a redis:// or rediss:// URL string, ioredis RedisOptions or a Redis / Cluster client';
const silent = { log() {}, error() {}, warn() {} };

/** Starts a module with `redis` as the option; answers the start-up error's message, or undefined when it started. */
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
    return (error as Error).message;
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
    expect(await startUp({ host: '10.9.8.7', passwrd: 'x' })).toContain('redis.passwrd is not an ioredis RedisOptions key (did you mean "password"?)');
    expect(await startUp({ hostname: '10.9.8.7' })).toContain('redis.hostname is not an ioredis RedisOptions key (did you mean "host"?)');
    expect(await startUp({ zzz: 1 })).toBe(`RateLimitModule: redis.zzz is not an ioredis RedisOptions key; redis must be ${ACCEPTED}`);
  });

  it('rejects a host or port of the wrong type', async () => {
    expect(await startUp({ host: '10.9.8.7', port: 'six' })).toBe(
      `RateLimitModule: redis.port must be a port number 0..65535 (got "six"); redis must be ${ACCEPTED}`,
    );
    expect(await startUp({ host: 6380 })).toBe(
      `RateLimitModule: redis.host must be a host name or address (got 6380); redis must be ${ACCEPTED}`,
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
        const client = new Redis(server.url, { enableOfflineQueue: false });
        await new Promise((resolve) => client.once('ready', resolve));
        expect(await decidesThrough(client)).toBe('true:2');
        expect(client.status).toBe('ready');
        client.disconnect();
        expect(await check.exists('rl:{redis-option-form}')).toBe(1);
      } finally {
        check.disconnect();
      }
    });

    it('takes a Cluster instance as a client, without checking its options', async () => {
      const cluster = new Cluster([{ host: '127.0.0.1', port: server.port }], { lazyConnect: true, enableOfflineQueue: false });
      const moduleRef = await Test.createTestingModule({ imports: [RateLimitModule.forRoot({ redis: cluster })] })
        .setLogger(silent)
        .compile();
      await moduleRef.close();
      cluster.disconnect();
    });
  });
});
