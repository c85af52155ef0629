import { execFileSync } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Test, type TestingModule } from '@nestjs/testing';
import { Redis } from 'ioredis';
import { type RateLimitConfigError, RateLimitModule, type RateLimitModuleOptions } from 'nest-redis-rate-limit';
import { sleep } from '../../support/load.js';
import { LogRecorder } from '../../support/log-recorder.js';
import { watchLoopDelay } from '../../support/loop-delay.js';
import { freePort, RedisServer } from '../../support/redis.js';

const PASSWORD = 'S3cret-server-pass';
const WRONG = 'Wr0ng-client-pass';

/**
 * A misconfiguration stops the start, an outage does not. For a client the module creates, app.init()
 * fails when Redis refuses the credentials or the user may not run the limiter's commands, or TLS
 * verification fails, naming host:port and the cause (never a password), and the connection is dropped.
 * A host that does not resolve, a refused or an unanswered connection start under failureMode with one
 * error-level line. `startupCheck: 'strict'` makes a host that does not resolve fatal too; false skips it.
 */
describe('the start-up check of the Redis connection', () => {
  let recorder: LogRecorder;
  let moduleRef: TestingModule | undefined;

  async function start(
    redis: RateLimitModuleOptions['redis'],
    options: Partial<RateLimitModuleOptions> = {},
  ): Promise<{ ms: number; error?: RateLimitConfigError }> {
    recorder = new LogRecorder();
    moduleRef = await Test.createTestingModule({
      imports: [RateLimitModule.forRoot({ redis, failureMode: 'open', keyPrefix: 'startup-check:', ...options })],
    })
      .setLogger(recorder)
      .compile();
    // `ms` is how long app.init() waited: its time less the event-loop delay over it, so that a
    // machine busy with other work does not lengthen it, and a wait (for an answer, a retry) still does.
    const loop = watchLoopDelay();
    const began = performance.now();
    const waited = () => {
      const ended = performance.now();
      loop.stop();
      return ended - began - loop.over(began, ended);
    };
    try {
      await moduleRef.init();
      return { ms: waited() };
    } catch (error) {
      moduleRef = undefined;
      return { ms: waited(), error: error as RateLimitConfigError };
    }
  }

  afterEach(async () => {
    await moduleRef?.close();
    moduleRef = undefined;
  });

  /** Connections the server accepted over `ms`: none once the failed start dropped its client. */
  async function connectionsDuring(server: RedisServer, ms: number): Promise<number> {
    const admin = new Redis(server.url, { password: PASSWORD });
    const count = async () => Number(/total_connections_received:(\d+)/.exec(await admin.info('stats'))![1]);
    try {
      const before = await count();
      await sleep(ms);
      return (await count()) - before;
    } finally {
      admin.disconnect();
    }
  }

  describe('a server that asks for a password', () => {
    let server: RedisServer;
    beforeAll(async () => {
      server = await RedisServer.startWithPassword(PASSWORD);
      const admin = new Redis(server.url, { password: PASSWORD });
      // May run the limiter's script on its own prefix only; may not write (HSET) anywhere.
      await admin.acl('SETUSER', 'other-prefix', 'on', '>user-pass', '~elsewhere:*', '+@all');
      await admin.acl('SETUSER', 'read-only', 'on', '>user-pass', '~startup-check:*', '+@all', '-hset');
      admin.disconnect();
    });
    afterAll(async () => {
      await server?.stop();
    });

    it('fails app.init() on a wrong password (WRONGPASS), naming host:port, never the password, and drops the connection', async () => {
      const { ms, error } = await start(`redis://:${WRONG}@127.0.0.1:${server.port}`);
      expect(ms).toBeLessThan(2000);
      expect(error).toMatchObject({ name: 'RateLimitConfigError', code: 'ERR_RATE_LIMIT_REDIS_AUTH' });
      expect(error?.reason).toBe(
        `RateLimitModule cannot start: Redis at 127.0.0.1:${server.port} refused the credentials: ` +
          'authentication failed: wrong username or password (WRONGPASS invalid username-password pair or user is disabled.); ' +
          'check redis.username and redis.password (or the URL), or set startupCheck: false to start without this check',
      );
      expect(JSON.stringify(recorder.lines)).not.toContain(WRONG);
      expect(await connectionsDuring(server, 700)).toBe(0);
    });

    it('fails app.init() when no password is given (NOAUTH)', async () => {
      const { error } = await start({ host: '127.0.0.1', port: server.port });
      expect(error?.code).toBe('ERR_RATE_LIMIT_REDIS_AUTH');
      expect(error?.message).toMatch(
        new RegExp(
          `^RateLimitModule cannot start: Redis at 127\\.0\\.0\\.1:${server.port} refused the credentials: authentication required: the server asks for a password and none was given \\(NOAUTH`,
        ),
      );
      expect(await connectionsDuring(server, 700)).toBe(0);
    });

    it('fails app.init() when the user may not touch the key prefix (NOPERM), saying what to grant', async () => {
      const { error } = await start({ host: '127.0.0.1', port: server.port, username: 'other-prefix', password: 'user-pass' });
      expect(error?.code).toBe('ERR_RATE_LIMIT_REDIS_ACL');
      expect(error?.reason).toBe(
        `RateLimitModule cannot start: Redis at 127.0.0.1:${server.port} does not let user "other-prefix" run the rate limiter's commands ` +
          '(NOPERM this user has no permissions to access one of the keys used as arguments); grant them: ' +
          'ACL SETUSER other-prefix ~startup-check:* +evalsha +eval +hmget +hget +hgetall +hset +hdel +pexpire +pttl +time +del',
      );
      expect(JSON.stringify(recorder.lines)).not.toContain('user-pass');
    });

    it('fails app.init() when the user may not run a command of the script, seen on a probe key', async () => {
      const { error } = await start({ host: '127.0.0.1', port: server.port, username: 'read-only', password: 'user-pass' });
      expect(error?.message).toMatch(
        new RegExp(
          `^RateLimitModule cannot start: Redis at 127\\.0\\.0\\.1:${server.port} does not let user "read-only" run the rate limiter's commands \\(.*\\); grant them: ACL SETUSER read-only`,
        ),
      );
    });

    it('starts with the right password, and leaves no probe key behind', async () => {
      const { error } = await start({ host: '127.0.0.1', port: server.port, password: PASSWORD });
      expect(error).toBeUndefined();
      expect(recorder.lines.filter((l) => l.level !== 'log')).toEqual([]);
      const admin = new Redis(server.url, { password: PASSWORD });
      expect(await admin.keys('startup-check:*')).toEqual([]);
      admin.disconnect();
    });

    it('starts with a wrong password under startupCheck: false, as before (a warning)', async () => {
      const { error } = await start({ host: '127.0.0.1', port: server.port, password: WRONG }, { startupCheck: false });
      expect(error).toBeUndefined();
      expect(recorder.of('RateLimit', 'warn')[0]).toContain('authentication failed');
    });

    it('does not check a client the application passes in', async () => {
      const client = new Redis({ port: server.port, password: WRONG, lazyConnect: true, enableOfflineQueue: false });
      client.on('error', () => undefined);
      const { error } = await start(client);
      expect(error).toBeUndefined();
      client.disconnect();
    });
  });

  it('fails app.init() when the TLS certificate does not verify, naming host:port', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'rl-tls-'));
    execFileSync(
      'openssl',
      [
        'req',
        '-x509',
        '-newkey',
        'rsa:2048',
        '-nodes',
        '-keyout',
        join(dir, 'key.pem'),
        '-out',
        join(dir, 'cert.pem'),
        '-days',
        '1',
        '-subj',
        '/CN=localhost',
      ],
      { stdio: 'ignore' },
    );
    const tlsPort = await freePort();
    const server = await RedisServer.start([
      '--tls-port',
      String(tlsPort),
      '--tls-cert-file',
      join(dir, 'cert.pem'),
      '--tls-key-file',
      join(dir, 'key.pem'),
      '--tls-auth-clients',
      'no',
    ]);
    try {
      const { ms, error } = await start(`rediss://127.0.0.1:${tlsPort}`);
      expect(ms).toBeLessThan(2000);
      expect(error?.code).toBe('ERR_RATE_LIMIT_REDIS_TLS');
      expect(error?.reason).toBe(
        `RateLimitModule cannot start: Redis at 127.0.0.1:${tlsPort} (TLS) failed the TLS handshake: ` +
          'TLS handshake failed: self-signed certificate (DEPTH_ZERO_SELF_SIGNED_CERT): is the server certificate trusted (tls.ca) and issued for this host name?; ' +
          'fix redis.tls (or use redis:// for a server without TLS), or set startupCheck: false to start without this check',
      );
    } finally {
      await server.stop();
    }
  });

  it('starts under failureMode when the host does not resolve, with one error-level line naming host:port and the cause', async () => {
    const { error } = await start('redis://no-such-host.invalid:6390');
    expect(error).toBeUndefined();
    const errors = recorder.of('RateLimit', 'error');
    expect(errors).toHaveLength(1);
    expect(errors[0]).toMatch(
      /^Redis at no-such-host\.invalid:6390 is not reachable at start-up: host not found \(getaddrinfo (ENOTFOUND|EAI_AGAIN) no-such-host\.invalid\); starting anyway: decisions follow failureMode 'open' until it answers \(startupCheck: 'strict' makes this fatal\)$/,
    );
  });

  it("fails app.init() on a host that does not resolve under startupCheck: 'strict'", async () => {
    const { error } = await start('redis://no-such-host.invalid:6390', { startupCheck: 'strict' });
    expect(error?.code).toBe('ERR_RATE_LIMIT_REDIS_UNREACHABLE');
    expect(error?.message).toMatch(
      /^RateLimitModule cannot start: Redis at no-such-host\.invalid:6390 is not reachable: host not found \(getaddrinfo (ENOTFOUND|EAI_AGAIN)/,
    );
  });

  it('starts under failureMode when the connection is refused, with an error-level line', async () => {
    const port = await freePort();
    const { error } = await start(`redis://127.0.0.1:${port}`, { startupCheck: 'strict', failureMode: 'closed' });
    expect(error).toBeUndefined();
    expect(recorder.of('RateLimit', 'error')).toEqual([
      `Redis at 127.0.0.1:${port} is not reachable at start-up: connection refused (connect ECONNREFUSED 127.0.0.1:${port}); ` +
        "starting anyway: decisions follow failureMode 'closed' until it answers",
    ]);
  });

  it('starts under failureMode when the server accepts but never answers, within the start-up wait', async () => {
    const paused = await RedisServer.start();
    paused.signal('SIGSTOP');
    try {
      const { ms, error } = await start(paused.url);
      expect(error).toBeUndefined();
      expect(ms).toBeLessThan(2500);
      expect(recorder.of('RateLimit', 'error')).toEqual([
        `Redis at 127.0.0.1:${paused.port} is not reachable at start-up: no answer within 1000 ms; ` +
          "starting anyway: decisions follow failureMode 'open' until it answers",
      ]);
      await moduleRef?.close();
      moduleRef = undefined;
    } finally {
      paused.signal('SIGCONT');
      await paused.stop();
    }
  });

  it('refuses an unknown startupCheck value', async () => {
    await expect(start('redis://127.0.0.1:6379', { startupCheck: 'yes' as 'strict' })).rejects.toThrow(
      `RateLimitModule: startupCheck must be one of 'default', 'strict', false (got "yes")`,
    );
  });
});
