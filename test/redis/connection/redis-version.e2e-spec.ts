import { Module, type Type } from '@nestjs/common';
import { RateLimitModule } from 'nest-redis-rate-limit';
import { FakeRedis, type FakeReply } from '../../support/fake-redis.js';
import { testPrefix } from '../../support/redis.js';
import { startUp } from '../../support/start-up.js';

/**
 * The start-up check refuses a Redis older than 7.0 (the script needs `PEXPIRE ... GT`), read from the
 * server's own answer to `INFO server`, not only from strings (redis-version-check.e2e-spec.ts): a server
 * that speaks the protocol (test/support/fake-redis.ts) answers as Redis 6.2 would. A check that did
 * not wait for the answer would read no version and let the app start. The same server answering as
 * 7.0.0 shows that nothing else stops the start.
 */
describe('the Redis version, read from the server at start-up', () => {
  const prefix = testPrefix('redis-version');
  let fake: FakeRedis | undefined;

  afterEach(async () => {
    await fake?.close();
    fake = undefined;
  });

  /** A server that answers INFO as Redis `version`, and every other command as a Redis that does not know it. */
  async function serverOf(version: string): Promise<FakeRedis> {
    return FakeRedis.start((command): FakeReply => {
      const name = command[0].toLowerCase();
      if (name === 'info') {
        return { bulk: `# Server\r\nredis_version:${version}\r\nredis_mode:standalone\r\n\r\n# Persistence\r\nloading:0\r\n` };
      }
      if (name === 'ping') return { status: 'PONG' };
      if (name === 'client' || name === 'select') return { status: 'OK' };
      return { error: `ERR unknown command '${command[0]}'` };
    });
  }

  /** The connections still open once they have had up to a second to close (a socket's close is told a moment later). */
  async function openAfterASecond(server: FakeRedis): Promise<number> {
    const deadline = Date.now() + 1000;
    while (server.openConnections > 0 && Date.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 20));
    return server.openConnections;
  }

  function appOn(url: string): Type {
    @Module({ imports: [RateLimitModule.forRoot({ redis: url, keyPrefix: prefix })] })
    class VersionAppModule {}
    return VersionAppModule;
  }

  it.each(['6.2.14', '5.0.7'])('refuses to start on a server that answers INFO as Redis %s, and drops its connection', async (version) => {
    fake = await serverOf(version);
    const port = new URL(fake.url).port;
    expect(await startUp(appOn(fake.url))).toEqual({
      phase: 'init',
      message:
        `RateLimitModule cannot start: Redis at 127.0.0.1:${port} runs Redis ${version}; the rate limiter's script needs ` +
        'Redis 7.0 or later (PEXPIRE ... GT): upgrade Redis, or set startupCheck: false to start without this check',
    });
    // It asked the server, and refused before the probe: no script was sent.
    expect(fake.commands).toContainEqual(['info', 'server']);
    expect(fake.commands.some(([name]) => /^eval/i.test(name))).toBe(false);
    expect(await openAfterASecond(fake)).toBe(0);
  });

  it('starts on the same server answering as Redis 7.0.0 (its failing probe is logged, not fatal)', async () => {
    fake = await serverOf('7.0.0');
    expect(await startUp(appOn(fake.url))).toEqual({ phase: 'started' });
    expect(fake.commands).toContainEqual(['info', 'server']);
    // Past the version check, the probe ran the script (the fake refuses it: logged, and the app starts).
    expect(fake.commands.some(([name]) => /^eval/i.test(name))).toBe(true);
  });
});
