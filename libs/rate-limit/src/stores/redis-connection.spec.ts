import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { Cluster, Redis } from 'ioredis';
import { checkRedisOption, describeCause, describeTarget, maskUrl, REDIS_OPTION_KEYS } from './redis-connection.js';

/** The option names declared in the `interface`/`type` block starting at `start` of an ioredis .d.ts file. */
function declaredKeys(file: string, start: RegExp): string[] {
  const text = readFileSync(file, 'utf8');
  const from = text.search(start);
  expect(from).toBeGreaterThanOrEqual(0);
  const lines = text.slice(from).split('\n');
  const keys: string[] = [];
  // Members sit at one indentation level (4 spaces); the block ends at the first line back at column 0 after it.
  for (const line of lines.slice(1)) {
    if (/^\S/.test(line)) break;
    const member = /^ {4}([A-Za-z]+)\??:/.exec(line);
    if (member) keys.push(member[1]);
  }
  return keys;
}

describe('the redis option check', () => {
  it('knows exactly the RedisOptions keys the installed ioredis declares', () => {
    const root = join(dirname(createRequire(import.meta.url).resolve('ioredis')), '..');
    const built = (path: string) => join(root, 'built', path);
    const declared = new Set([
      ...declaredKeys(built('utils/Commander.d.ts'), /export interface CommanderOptions/),
      ...declaredKeys(built('redis/RedisOptions.d.ts'), /export interface CommonRedisOptions/),
      ...declaredKeys(built('connectors/SentinelConnector/index.d.ts'), /export interface SentinelConnectionOptions/),
      ...declaredKeys(built('connectors/StandaloneConnector.d.ts'), /export type StandaloneConnectionOptions/),
      // StandaloneConnectionOptions picks these from node's net options.
      'port',
      'host',
      'family',
      'path',
    ]);
    expect([...REDIS_OPTION_KEYS].sort()).toEqual([...declared].sort());
  });

  it('accepts URLs and RedisOptions as they are', () => {
    expect(checkRedisOption('rediss://user:pw@cache.example:6380/2')).toBe('rediss://user:pw@cache.example:6380/2');
    const options = { host: 'cache', port: 6380, password: 'pw', sentinels: undefined, tls: {} };
    expect(checkRedisOption(options)).toBe(options);
    expect(checkRedisOption({ port: '6380' })).toEqual({ port: '6380' });
  });

  it.each([
    ['http://admin:S3cret@10.0.0.1:6379', 'http://admin:***@10.0.0.1:6379'],
    ['redis://:S3cret@10.0.0.1', 'redis://:***@10.0.0.1'],
    ['admin:S3cret@10.0.0.1:6379', 'admin:***@10.0.0.1:6379'],
    ['redis://10.0.0.1?password=S3cret&db=1', 'redis://10.0.0.1?password=***&db=1'],
    ['redis://10.0.0.1:6379', 'redis://10.0.0.1:6379'],
  ])('masks the password of %s', (url, masked) => {
    expect(maskUrl(url)).toBe(masked);
  });
});

describe('connection causes in words', () => {
  const error = (message: string, code?: string) => Object.assign(new Error(message), code ? { code } : {});
  it.each([
    [error('connect ECONNREFUSED 10.0.0.1:6379', 'ECONNREFUSED'), 'connection refused (connect ECONNREFUSED 10.0.0.1:6379)'],
    [error('getaddrinfo EAI_AGAIN redis', 'EAI_AGAIN'), 'host not found (getaddrinfo EAI_AGAIN redis)'],
    [error('WRONGPASS invalid username-password pair or user is disabled.'), 'authentication failed: wrong username or password (WRONGPASS invalid username-password pair or user is disabled.)'],
    [error('ERR invalid password'), 'authentication failed: wrong username or password (ERR invalid password)'],
    [error('NOAUTH Authentication required.'), 'authentication required: the server asks for a password and none was given (NOAUTH Authentication required)'],
    [error('self-signed certificate', 'DEPTH_ZERO_SELF_SIGNED_CERT'), 'TLS handshake failed: self-signed certificate (DEPTH_ZERO_SELF_SIGNED_CERT): is the server certificate trusted (tls.ca) and issued for this host name?'],
    [error('connect ETIMEDOUT', 'ETIMEDOUT'), 'connection timed out (connect ETIMEDOUT)'],
  ])('describes %s', (cause, words) => {
    expect(describeCause(cause)).toBe(words);
  });

  it('hints at TLS when a TLS connection times out', () => {
    expect(describeCause(error('connect ETIMEDOUT', 'ETIMEDOUT'), true)).toBe(
      'connection timed out (with TLS on, also check that the server speaks TLS on this port) (connect ETIMEDOUT)',
    );
  });
});

describe('where a client connects, in words', () => {
  it.each([
    [{ host: 'cache.internal', port: 6380 }, 'Redis at cache.internal:6380'],
    [{ host: 'cache.internal', port: 6380, tls: {} }, 'Redis at cache.internal:6380 (TLS)'],
    [{ path: '/run/redis.sock' }, 'Redis at /run/redis.sock'],
    [
      { sentinels: [{ host: 's1', port: 26379 }, { host: 's2' }], name: 'mymaster', password: 'pw' },
      'Redis master "mymaster" via sentinels s1:26379, s2:26379',
    ],
  ])('describes %j as %s', (options, text) => {
    const client = new Redis({ ...options, lazyConnect: true });
    expect(describeTarget(client)).toBe(text);
    client.disconnect();
  });

  it('describes a URL client by its host and port, without the password', () => {
    const client = new Redis('redis://:S3cret@cache.internal:6390/1', { lazyConnect: true });
    expect(describeTarget(client)).toBe('Redis at cache.internal:6390');
    client.disconnect();
  });

  it('describes a Cluster by its startup nodes', () => {
    const cluster = new Cluster([{ host: 'a', port: 7000 }, { host: 'b', port: 7001 }, 'redis://:S3cret@c:7002'], { lazyConnect: true });
    expect(describeTarget(cluster)).toBe('Redis Cluster (a:7000, b:7001, redis://:***@c:7002)');
    cluster.disconnect();
  });
});
