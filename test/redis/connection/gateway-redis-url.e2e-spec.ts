import { Logger } from '@nestjs/common';
import { gatewayRateLimitOptions } from '../../../apps/gateway/src/redis-probe.js';
import { freePort, RedisServer } from '../../support/redis.js';

const PASSWORD = 'S3cret-demo-pass';

/** The demo logs where its Redis is, and REDIS_URL may carry a password: it logs the URL masked. */
describe('the demo gateway and REDIS_URL', () => {
  let server: RedisServer;
  let lines: string[];

  beforeAll(async () => {
    server = await RedisServer.startWithPassword(PASSWORD);
  });
  afterAll(async () => {
    await server?.stop();
  });
  beforeEach(() => {
    lines = [];
    const record = (message: unknown) => void lines.push(String(message));
    Logger.overrideLogger({ log: record, warn: record, error: record });
  });
  afterEach(() => Logger.overrideLogger(false));

  it('logs the Redis it uses without its password', async () => {
    const url = `redis://default:${PASSWORD}@127.0.0.1:${server.port}/0`;
    expect(await gatewayRateLimitOptions(url)).toEqual({ redis: url, keyPrefix: 'gateway:' });
    expect(lines).toEqual([`Rate limits are shared through Redis at redis://default:***@127.0.0.1:${server.port}/0`]);
  });

  it('logs an unreachable Redis without its password', async () => {
    const port = await freePort();
    expect(await gatewayRateLimitOptions(`redis://:${PASSWORD}@127.0.0.1:${port}?db=1`)).toEqual({
      store: 'memory',
      keyPrefix: 'gateway:',
    });
    expect(lines).toHaveLength(1);
    expect(lines[0]).toContain(`No Redis answers at redis://:***@127.0.0.1:${port}?db=1`);
    expect(lines.join('\n')).not.toContain(PASSWORD);
  });
});
