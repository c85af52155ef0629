import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { existsSync } from 'node:fs';
import { createServer } from 'node:net';
import { Redis } from 'ioredis';
import { redisAnswers } from 'nest-redis-rate-limit';

/**
 * Redis for tests, in this order: REDIS_URL; 127.0.0.1:6379 if it answers; a `redis-server` binary
 * started on a free port; a testcontainers Redis where a Docker engine runs; else a clear failure.
 * Tests that stop or kill Redis use `startRedisServer()` and never touch the shared server.
 */

/** Answers whether PING succeeds at `url` within `timeoutMs`. */
export const pingRedis = redisAnswers;

/** A free TCP port on the loopback interface. */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.unref();
    server.on('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const address = server.address();
      server.close(() => (typeof address === 'object' && address ? resolve(address.port) : reject(new Error('no port'))));
    });
  });
}

export function hasRedisServerBinary(): boolean {
  return spawnSync('redis-server', ['--version'], { stdio: 'ignore' }).status === 0;
}

/** A `redis-server` of the test's own, on a free port, keeping nothing on disk. */
export class RedisServer {
  private child?: ChildProcess;

  private constructor(
    readonly port: number,
    private readonly extraArgs: string[],
  ) {}

  static async start(extraArgs: string[] = []): Promise<RedisServer> {
    const server = new RedisServer(await freePort(), extraArgs);
    await server.start();
    return server;
  }

  get url(): string {
    return `redis://127.0.0.1:${this.port}`;
  }

  get pid(): number | undefined {
    return this.child?.pid;
  }

  /** Starts (or starts again, on the same port) and waits until it answers PING. */
  async start(): Promise<void> {
    const child = spawn(
      'redis-server',
      ['--port', String(this.port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', ...this.extraArgs],
      { stdio: 'ignore' },
    );
    this.child = child;
    const deadline = Date.now() + 10_000;
    while (Date.now() < deadline) {
      if (child.exitCode !== null) throw new Error(`redis-server on port ${this.port} exited with ${child.exitCode}`);
      if (await pingRedis(this.url, 500)) return;
      await new Promise((r) => setTimeout(r, 50));
    }
    throw new Error(`redis-server on port ${this.port} did not answer within 10 s`);
  }

  /** Sends a signal (SIGKILL to crash it, SIGSTOP / SIGCONT to freeze and thaw it). */
  signal(signal: NodeJS.Signals): void {
    this.child?.kill(signal);
  }

  /** Kills the server and waits until the process is gone. */
  async stop(signal: NodeJS.Signals = 'SIGKILL'): Promise<void> {
    const child = this.child;
    if (!child || child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
    child.kill('SIGCONT');
    child.kill(signal);
    await exited;
  }
}

async function startContainer(): Promise<{ url: string; stop: () => Promise<void> }> {
  // Optional: only where a Docker engine exists and @testcontainers/redis is installed.
  const moduleName = '@testcontainers/redis';
  const { RedisContainer } = await import(moduleName);
  const container = await new RedisContainer('redis:7').start();
  return { url: container.getConnectionUrl(), stop: () => container.stop() };
}

async function provideRedis(): Promise<string> {
  if (process.env.REDIS_URL) {
    if (await pingRedis(process.env.REDIS_URL)) return process.env.REDIS_URL;
    throw new Error(`REDIS_URL=${process.env.REDIS_URL} does not answer PING`);
  }
  const local = 'redis://127.0.0.1:6379';
  if (await pingRedis(local)) return local;
  if (hasRedisServerBinary()) {
    const server = await RedisServer.start();
    process.once('exit', () => server.signal('SIGKILL'));
    return server.url;
  }
  if (existsSync('/var/run/docker.sock')) {
    try {
      const container = await startContainer();
      process.once('beforeExit', () => void container.stop());
      return container.url;
    } catch (error) {
      throw new Error(`Could not start a Redis container: ${(error as Error).message}`);
    }
  }
  throw new Error(
    'No Redis for the tests: set REDIS_URL, run redis-server on 127.0.0.1:6379 ' +
      '(e.g. `redis-server --daemonize yes --port 6379 --save ""`), or install redis-server.',
  );
}

/**
 * The Redis the tests share. Found once per jest worker and kept in process.env, which outlives the
 * per-file module registry; a server it had to start dies with the worker.
 */
export async function redisUrl(): Promise<string> {
  if (!process.env.REDIS_URL_RESOLVED) {
    process.env.REDIS_URL = await provideRedis();
    process.env.REDIS_URL_RESOLVED = '1';
  }
  return process.env.REDIS_URL as string;
}

/** A key prefix no other test file or run shares. */
export function testPrefix(scenario: string): string {
  return `rl-test:${scenario}:${randomUUID().slice(0, 8)}:`;
}

/** Deletes every key under `prefix` (never a FLUSH: the server is shared). */
export async function deleteKeys(client: Redis, prefix: string): Promise<void> {
  let cursor = '0';
  do {
    const [next, keys] = await client.scan(cursor, 'MATCH', `${prefix}*`, 'COUNT', 1000);
    cursor = next;
    if (keys.length > 0) await client.del(...keys);
  } while (cursor !== '0');
}

/** Keys under `prefix`. */
export async function keysUnder(client: Redis, prefix: string): Promise<string[]> {
  const found: string[] = [];
  let cursor = '0';
  do {
    const [next, keys] = await client.scan(cursor, 'MATCH', `${prefix}*`, 'COUNT', 1000);
    cursor = next;
    found.push(...keys);
  } while (cursor !== '0');
  return found.sort();
}

/** Calls of one command since the server started (INFO commandstats), e.g. 'evalsha'. */
export async function commandCalls(client: Redis, command: string): Promise<number> {
  const info = await client.info('commandstats');
  const match = new RegExp(`^cmdstat_${command}:calls=(\\d+)`, 'm').exec(info);
  return match ? Number(match[1]) : 0;
}

/** Script runs since the server started: EVALSHA, plus EVAL (ioredis sends the body once after NOSCRIPT). */
export async function scriptCalls(client: Redis): Promise<number> {
  return (await commandCalls(client, 'evalsha')) + (await commandCalls(client, 'eval'));
}
