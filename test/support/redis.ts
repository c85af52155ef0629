import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { createServer } from 'node:net';
import { type Cluster, Redis } from 'ioredis';
import { redisAnswers } from 'nest-redis-rate-limit';

/**
 * Redis for tests, in this order (`findRedis`): REDIS_URL; 127.0.0.1:6379 if it answers; a
 * `redis-server` binary started on a free port; a testcontainers Redis where a container runtime
 * answers; else a clear failure. Tests that stop or kill Redis use `RedisServer.start()` and never
 * touch the shared server.
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

  /** A server that asks for `password` (started without one, so that the start can see it answer). */
  static async startWithPassword(password: string): Promise<RedisServer> {
    const server = await RedisServer.start();
    const admin = new Redis(server.url);
    await admin.config('SET', 'requirepass', password);
    admin.disconnect();
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

/** Where the tests' Redis came from, in the order they are tried. */
export type RedisSource = 'REDIS_URL' | '127.0.0.1:6379' | 'redis-server' | 'container';

/** Whether a container runtime (a Docker engine, or Podman, Colima...) answers, and why not if not. */
export type RuntimeProbe = { answers: true } | { answers: false; reason: string };

/** Everything `findRedis` asks the machine, as parameters so that the order can be tested without one. */
export interface RedisProbes {
  /** The REDIS_URL environment variable. */
  configuredUrl: string | undefined;
  ping(url: string): Promise<boolean>;
  hasRedisServerBinary(): boolean;
  /** Starts a `redis-server` of the run's own and returns its URL. */
  startRedisServer(): Promise<string>;
  containerRuntime(): Promise<RuntimeProbe>;
  /** Starts a Redis container and returns its URL. */
  startRedisContainer(): Promise<string>;
}

export const LOCAL_REDIS = 'redis://127.0.0.1:6379';

/**
 * The first Redis available: REDIS_URL (which must answer: it is never silently replaced); else
 * 127.0.0.1:6379 if it answers; else a `redis-server` binary started on a free port; else a container
 * through testcontainers when a container runtime answers; else an error saying how to get one.
 */
export async function findRedis(probes: RedisProbes): Promise<{ url: string; source: RedisSource }> {
  if (probes.configuredUrl) {
    if (await probes.ping(probes.configuredUrl)) return { url: probes.configuredUrl, source: 'REDIS_URL' };
    throw new Error(`REDIS_URL=${probes.configuredUrl} does not answer PING`);
  }
  if (await probes.ping(LOCAL_REDIS)) return { url: LOCAL_REDIS, source: '127.0.0.1:6379' };
  if (probes.hasRedisServerBinary()) return { url: await probes.startRedisServer(), source: 'redis-server' };
  const runtime = await probes.containerRuntime();
  if (runtime.answers) {
    try {
      return { url: await probes.startRedisContainer(), source: 'container' };
    } catch (error) {
      throw new Error(`Could not start a Redis container: ${(error as Error).message}`);
    }
  }
  throw new Error(
    'No Redis for the tests: set REDIS_URL, run redis-server on 127.0.0.1:6379 ' +
      '(e.g. `redis-server --daemonize yes --port 6379 --save ""`), install redis-server, ' +
      `or run a Docker engine for testcontainers (${runtime.reason}).`,
  );
}

/** The probes of this machine, now. testcontainers is imported only when the earlier choices failed. */
export const machineProbes = (): RedisProbes => ({
  configuredUrl: process.env.REDIS_URL,
  ping: (url) => pingRedis(url),
  hasRedisServerBinary,
  async startRedisServer() {
    const server = await RedisServer.start();
    process.once('exit', () => server.signal('SIGKILL'));
    return server.url;
  },
  async containerRuntime() {
    let testcontainers: typeof import('testcontainers');
    try {
      testcontainers = await import('testcontainers');
    } catch (error) {
      // A testcontainers that does not load on this Node (version 12 needs Node 22.22+) is no runtime.
      return {
        answers: false,
        reason: `testcontainers cannot be loaded on Node ${process.versions.node}: ${(error as Error).message}`,
      };
    }
    try {
      await testcontainers.getContainerRuntimeClient();
      return { answers: true };
    } catch (error) {
      return { answers: false, reason: `no container runtime answers: ${(error as Error).message}` };
    }
  },
  async startRedisContainer() {
    const { RedisContainer } = await import('@testcontainers/redis');
    const container = await new RedisContainer('redis:7').start();
    // testcontainers' reaper removes the container if this process dies before stopping it.
    process.once('beforeExit', () => void container.stop());
    return container.getConnectionUrl();
  },
});

/**
 * The Redis the tests share. Found once per jest worker and kept in process.env, which outlives the
 * per-file module registry; a server it had to start dies with the worker.
 */
export async function redisUrl(): Promise<string> {
  if (!process.env.REDIS_URL_RESOLVED) {
    process.env.REDIS_URL = (await findRedis(machineProbes())).url;
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

/**
 * The tokens stored in the bucket hash at `key` (no refill applied). Throws when the key does not
 * exist: `Number(null)` is 0, which would pass for a drained bucket and hide a bucket never written.
 */
export async function tokensOf(client: Pick<Redis, 'hget'> | Pick<Cluster, 'hget'>, key: string): Promise<number> {
  const value = await client.hget(key, 'tokens');
  if (value === null) throw new Error(`no bucket at ${key}: the key does not exist in Redis`);
  return Number(value);
}
