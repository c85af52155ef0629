import { createServer, type Server } from 'node:net';
import { Test, type TestingModule } from '@nestjs/testing';
import { Redis } from 'ioredis';
import { BucketService, RateLimitModule, type RateLimitModuleOptions } from 'nest-redis-rate-limit';
import { sleep } from '../../support/load.js';
import { LogRecorder } from '../../support/log-recorder.js';
import { freePort, RedisServer } from '../../support/redis.js';

const PASSWORD = 'S3cret-server-pass';
const WRONG = 'Wr0ng-client-pass';

/**
 * A connection problem is logged with the address the module tried and what went wrong — refused,
 * host not found, authentication, TLS — at most once per 10 s, and never with a password. At start-up,
 * an outage is one error-level line (test/redis/connection/startup-check: misconfiguration fails the
 * start); the wording of authentication and TLS failures is checked here with `startupCheck: false`,
 * where they are warnings while the client keeps retrying, as before that check existed.
 */
describe('what the module logs when it cannot use Redis', () => {
  let recorder: LogRecorder;
  let moduleRef: TestingModule | undefined;

  /** Starts the module with `redis` as a real application would (init waits up to 1 s for Redis). */
  async function start(redis: RateLimitModuleOptions['redis'], startupCheck?: false): Promise<TestingModule> {
    recorder = new LogRecorder();
    moduleRef = await Test.createTestingModule({
      imports: [RateLimitModule.forRoot({ redis, failureMode: 'open', timeoutMs: 50, startupCheck })],
    })
      .setLogger(recorder)
      .compile();
    await moduleRef.init();
    return moduleRef;
  }

  afterEach(async () => {
    await moduleRef?.close();
    moduleRef = undefined;
  });

  describe('a server that asks for a password', () => {
    let server: RedisServer;
    beforeAll(async () => {
      server = await RedisServer.startWithPassword(PASSWORD);
    });
    afterAll(async () => {
      await server?.stop();
    });

    it('logs a wrong password (WRONGPASS) as an authentication failure at host:port, without the password', async () => {
      await start(`redis://:${WRONG}@127.0.0.1:${server.port}`, false);
      const warnings = recorder.of('RateLimit', 'warn');
      expect(warnings).toHaveLength(1);
      expect(warnings[0]).toContain(`Redis at 127.0.0.1:${server.port}`);
      expect(warnings[0]).toContain('authentication failed: wrong username or password');
      expect(warnings[0]).toContain('WRONGPASS');
      expect(JSON.stringify(recorder.lines)).not.toContain(WRONG);
      expect(JSON.stringify(recorder.lines)).not.toContain(PASSWORD);
    });

    it('logs a missing password (NOAUTH) as an authentication failure', async () => {
      await start({ host: '127.0.0.1', port: server.port }, false);
      const warnings = recorder.of('RateLimit', 'warn');
      expect(warnings).toHaveLength(1);
      expect(warnings[0]).toContain(`Redis at 127.0.0.1:${server.port}`);
      expect(warnings[0]).toContain('authentication required: the server asks for a password and none was given (NOAUTH');
    });

    it('names the cause in the warning of a failed decision too', async () => {
      const buckets = (await start({ host: '127.0.0.1', port: server.port, username: 'default', password: WRONG }, false)).get(
        BucketService,
      );
      const decision = await buckets.consume('connection-errors', { capacity: 2, refillPerSecond: 1 });
      expect(decision.allowed).toBe(true); // failureMode 'open'
      const failed = recorder.of('RateLimit', 'warn').filter((w) => w.startsWith('Rate-limit store failed'));
      expect(failed).toHaveLength(1);
      expect(failed[0]).toContain(`Redis at 127.0.0.1:${server.port} is not connected: authentication failed`);
      expect(JSON.stringify(recorder.lines)).not.toContain(WRONG);
    });

    it('starts deciding once the password is right, without a restart of the app', async () => {
      const buckets = (await start({ host: '127.0.0.1', port: server.port, password: PASSWORD })).get(BucketService);
      expect(recorder.of('RateLimit', 'warn')).toEqual([]);
      expect((await buckets.consume('connection-errors-ok', { capacity: 2, refillPerSecond: 1 })).remaining).toBe(1);
    });
  });

  it('logs a refused connection with host:port, once per 10 s however often the client retries', async () => {
    const port = await freePort();
    const buckets = (await start(`redis://127.0.0.1:${port}`)).get(BucketService);
    await sleep(300); // ioredis has retried several times by now (50, 100, 200, 400 ms): more 'error' events
    for (let i = 0; i < 20; i++) await buckets.consume('refused', { capacity: 2, refillPerSecond: 1 });
    const warnings = recorder.of('RateLimit', 'warn');
    // The start-up line counts as the first of the 10 s: the retries since then add no line.
    expect(recorder.of('RateLimit', 'error')).toEqual([
      `Redis at 127.0.0.1:${port} is not reachable at start-up: connection refused (connect ECONNREFUSED 127.0.0.1:${port}); ` +
        "starting anyway: decisions follow failureMode 'open' until it answers",
    ]);
    expect(warnings.filter((w) => w.startsWith('Cannot connect'))).toEqual([]);
    expect(warnings.filter((w) => w.startsWith('Rate-limit store failed'))).toHaveLength(1);
  });

  it('logs a host that does not resolve as "host not found"', async () => {
    await start('redis://no-such-host.invalid:6390', false);
    const warnings = recorder.of('RateLimit', 'warn');
    expect(warnings).toHaveLength(1);
    expect(warnings[0]).toMatch(
      /^Cannot connect to Redis at no-such-host\.invalid:6390: host not found \(getaddrinfo (ENOTFOUND|EAI_AGAIN) no-such-host\.invalid\)/,
    );
  });

  describe('TLS', () => {
    let plain: Server;
    let port: number;
    beforeAll(async () => {
      // A server that answers a TLS hello in plain text, as a Redis port without TLS would do with any reply.
      plain = createServer((socket) => {
        socket.on('error', () => undefined);
        socket.once('data', () => socket.end('-ERR not TLS\r\n'));
      });
      await new Promise<void>((resolve) => plain.listen(0, '127.0.0.1', resolve));
      port = (plain.address() as { port: number }).port;
    });
    afterAll(() => new Promise<void>((resolve) => plain.close(() => resolve())));

    it('logs a rediss:// URL against a server without TLS as a TLS failure', async () => {
      await start(`rediss://127.0.0.1:${port}`, false);
      const warnings = recorder.of('RateLimit', 'warn');
      expect(warnings).toHaveLength(1);
      expect(warnings[0]).toContain(`Cannot connect to Redis at 127.0.0.1:${port} (TLS): TLS handshake failed: wrong version number`);
      expect(warnings[0]).toContain('does the server speak TLS on this port?');
    });
  });

  it('adds no listener to a client the application passes in', async () => {
    const port = await freePort();
    const client = new Redis({ port, lazyConnect: true, enableOfflineQueue: false });
    const before = client.listenerCount('error');
    await start(client);
    expect(client.listenerCount('error')).toBe(before);
    expect(client.options.reconnectOnError).toBeNull();
    client.disconnect();
  });
});
