import { Redis } from 'ioredis';
import { redisUrl } from '../../support/redis.js';
import { versionTooOld } from '../../../libs/rate-limit/src/stores/redis/redis-startup.check.js';

describe('the start-up check of the Redis version (the script needs PEXPIRE ... GT, Redis 7.0)', () => {
  it.each([
    ['# Server\r\nredis_version:6.2.14\r\nredis_git_sha1:00000000\r\n', '6.2.14'],
    ['redis_version:5.0.7\r\n', '5.0.7'],
    ['redis_version:6.9.0\n', '6.9.0'],
  ])('names an older server: %j is too old (%s)', (info, version) => {
    expect(versionTooOld(info)).toBe(version);
  });

  it.each([
    'redis_version:7.0.0\r\n',
    'redis_version:7.0.15\r\n',
    'redis_version:7.2.4\r\n',
    'redis_version:8.0.1\r\n',
    'redis_version:10.0.0\r\n',
    '',
  ])('accepts %j', (info) => {
    expect(versionTooOld(info)).toBeUndefined();
  });

  it("accepts this machine's Redis, read from its own INFO reply", async () => {
    const client = new Redis(await redisUrl());
    try {
      const info = await client.info('server');
      expect(info).toMatch(/^redis_version:\d+\.\d+/m);
      expect(versionTooOld(info)).toBeUndefined();
    } finally {
      client.disconnect();
    }
  });
});
