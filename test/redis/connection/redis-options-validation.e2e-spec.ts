import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { Redis } from 'ioredis';
import {
  checkRedisOption,
  LATER_KEYS,
  maskUrl,
  REDIS_OPTION_KEYS,
  redisOptionKeysFor,
} from '../../../libs/rate-limit/src/stores/redis/redis-options.validation.js';

/** ioredis' own defaults object (a static of Redis, private in its types). */
const defaults = (Redis as unknown as { defaultOptions: Record<string, unknown> }).defaultOptions;

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
    expect([...redisOptionKeysFor(defaults)].sort()).toEqual([...declared].sort());
  });

  it("accepts every key of the installed ioredis' own defaults object", () => {
    const unknown = Object.keys(defaults).filter((key) => !REDIS_OPTION_KEYS.has(key));
    expect(unknown).toEqual([]);
  });

  it('accepts the keys only later ioredis versions read only where their marker is among the defaults', () => {
    for (const [key, { marker }] of Object.entries(LATER_KEYS)) {
      expect(REDIS_OPTION_KEYS.has(key)).toBe(true);
      // ioredis 5.8's defaults have neither marker (read in its sources at v5.8.0).
      expect(redisOptionKeysFor({ host: 'localhost' }).has(key)).toBe(false);
      expect(redisOptionKeysFor({ [marker]: 1 }).has(key)).toBe(true);
    }
    const { protocol, blockingTimeoutGrace } = defaults;
    // ioredis 6 is the one installed here: it reads them all.
    expect([protocol, blockingTimeoutGrace].every((value) => value !== undefined)).toBe(true);
  });

  it('accepts URLs and RedisOptions as they are', () => {
    expect(checkRedisOption('rediss://user:pw@cache.example:6380/2')).toBe('rediss://user:pw@cache.example:6380/2');
    const options = { host: 'cache', port: 6380, password: 'pw', sentinels: undefined, tls: {} };
    expect(checkRedisOption(options)).toBe(options);
    const withStringPort = { host: 'cache', port: '6380' };
    expect(checkRedisOption(withStringPort)).toEqual({ host: 'cache', port: 6380, sentinels: undefined });
    expect(withStringPort.port).toBe('6380');
    const withStringSentinelPort = checkRedisOption({ sentinels: [{ host: 's1', port: '26380' }], name: 'main' });
    expect(withStringSentinelPort).toStrictEqual({ sentinels: [{ host: 's1', port: 26380 }], name: 'main' });
    // The module checks the options twice (resolving them, then creating the client): the answer passes again.
    expect(checkRedisOption(withStringSentinelPort)).toBe(withStringSentinelPort);
    const sentinelOptions = { sentinels: [{ host: 's1', port: 26380 }], name: 'main' };
    expect(checkRedisOption(sentinelOptions)).toBe(sentinelOptions);
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
