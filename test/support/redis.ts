import { type ChildProcess, spawnSync } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { createServer } from 'node:net';
import { type Cluster, Redis } from 'ioredis';
// The module itself, not the package index: the run's globalSetup loads this file outside jest.
import { redisAnswers } from '../../libs/rate-limit/src/stores/redis/redis-probe.js';
import { isRunning, killChild, signalChild, spawnChild } from './children.js';

/**
 * Redis for tests, in this order (`findRedis`): REDIS_URL; 127.0.0.1:6379 if it answers; a
 * `redis-server` binary started on a free port; a testcontainers Redis where a container runtime
 * answers; else a clear failure. The run's globalSetup (test/support/test-run.ts) finds it once for
 * the whole jest run and exports REDIS_URL. Tests that stop or kill Redis use `RedisServer.start()`
 * and never touch the shared server; its process is killed by the run's teardown if a test forgets.
 */

/** Answers whether PING succeeds at `url` within `timeoutMs`. */
export const pingRedis = redisAnswers;

/**
 * `source`'s ports, never one twice: what `source` gives again is skipped. freePort is one such source
 * for the whole module, so that servers a test file starts at once never race for one port (jest loads
 * the module once per test file; the files of a worker run one after the other).
 */
export function neverTwice(source: () => Promise<number>): () => Promise<number> {
  const handedOut = new Set<number>();
  return async () => {
    for (;;) {
      const port = await source();
      if (!handedOut.has(port)) {
        handedOut.add(port);
        return port;
      }
    }
  };
}

/**
 * A free TCP port on the loopback interface, never one handed out before by this module. It is free when
 * asked, not reserved: another process, or an outgoing connection (its local port comes from the same
 * range), may take it before a server binds it. The starts below try again on another port when that
 * happens (`START_TRIES`).
 */
export const freePort = neverTwice(anyFreePort);

function anyFreePort(): Promise<number> {
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

/**
 * Starts of a server (or a Sentinel deployment) on free ports before the test fails: a process that exits
 * at once on a port `freePort` found free most likely lost it to another process meanwhile.
 */
export const START_TRIES = 3;

/** A `redis-server` that exited before it answered: on a port just found free, most likely because it was taken. */
export class ExitedAtStartUp extends Error {}

/** `start()` (on new free ports each time) until it does not throw ExitedAtStartUp, START_TRIES times at most. */
export async function startOnFreePorts<T>(start: () => Promise<T>, what = ''): Promise<T> {
  const exits: string[] = [];
  for (;;) {
    try {
      return await start();
    } catch (error) {
      if (!(error instanceof ExitedAtStartUp)) throw error;
      exits.push(error.message);
      if (exits.length === START_TRIES) throw new ExitedAtStartUp(`${what}${START_TRIES} starts failed: ${exits.join('; ')}`);
    }
  }
}

/** A `redis-server` of the test's own, on a free port, keeping nothing on disk. */
export class RedisServer {
  private child?: ChildProcess;

  private constructor(
    readonly port: number,
    private readonly extraArgs: string[],
  ) {}

  /**
   * A server on a free port (from `port`), answering PING. One that exits at once is started again on
   * another port, up to START_TRIES starts (see `start()`: on failure it is killed, then this throws).
   */
  static start(extraArgs: string[] = [], startTimeoutMs?: number, port: () => Promise<number> = freePort): Promise<RedisServer> {
    return startOnFreePorts(async () => {
      const server = new RedisServer(await port(), extraArgs);
      await server.start(startTimeoutMs);
      return server;
    });
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

  /**
   * Starts (or starts again, on the same port) and waits until it answers PING, at most
   * `startTimeoutMs` (10 s). A server that exits or does not answer is killed before this throws.
   */
  async start(startTimeoutMs = 10_000): Promise<void> {
    const child = spawnChild(
      'redis-server',
      ['--port', String(this.port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', ...this.extraArgs],
      { stdio: 'ignore' },
    );
    this.child = child;
    // A test that forgets stop() must not keep its jest worker alive: the run's teardown kills it.
    child.unref();
    let spawnError: Error | undefined;
    child.once('error', (error) => (spawnError = error));
    const deadline = Date.now() + startTimeoutMs;
    let failure: string;
    let exited = false;
    for (;;) {
      if (spawnError) {
        failure = `could not be started: ${spawnError.message}`;
        break;
      }
      if (!isRunning(child)) {
        failure = `exited with ${child.exitCode ?? child.signalCode} before it answered`;
        exited = true;
        break;
      }
      if (await pingRedis(this.url, 500)) return;
      if (Date.now() >= deadline) {
        failure = `did not answer within ${startTimeoutMs} ms`;
        break;
      }
      await new Promise((r) => setTimeout(r, 50));
    }
    await killChild(child);
    const message = `redis-server (pid ${child.pid}) on port ${this.port} ${failure}`;
    throw exited ? new ExitedAtStartUp(message) : new Error(message);
  }

  /** Sends a signal (SIGKILL to crash it, SIGSTOP / SIGCONT to freeze and thaw it). */
  signal(signal: NodeJS.Signals): void {
    if (this.child) signalChild(this.child, signal);
  }

  /** Kills the server (SIGCONT first, so that a frozen server dies at once) and waits until it is gone. */
  async stop(signal: NodeJS.Signals = 'SIGKILL'): Promise<void> {
    if (this.child) await killChild(this.child, signal);
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

/** Whether `url` names this machine (127.0.0.0/8, ::1 or localhost). */
export function isLoopback(url: string): boolean {
  let host: string;
  try {
    host = new URL(url).hostname;
  } catch {
    return false;
  }
  return host === 'localhost' || host === '[::1]' || host === '::1' || /^127\.\d+\.\d+\.\d+$/.test(host);
}

/**
 * The first Redis available: REDIS_URL (which must answer: it is never silently replaced by another
 * server, but when it names a loopback port where nothing listens and redis-server is installed, a
 * redis-server of the run's own is started on a free port, e.g. with REDIS_URL=redis://127.0.0.1:1); else
 * 127.0.0.1:6379 if it answers; else a `redis-server` binary started on a free port; else a container
 * through testcontainers when a container runtime answers; else an error saying how to get one.
 */
export async function findRedis(probes: RedisProbes): Promise<{ url: string; source: RedisSource }> {
  if (probes.configuredUrl) {
    if (await probes.ping(probes.configuredUrl)) return { url: probes.configuredUrl, source: 'REDIS_URL' };
    // Nothing on a loopback port (e.g. redis://127.0.0.1:1): the run starts a redis-server of its own.
    if (isLoopback(probes.configuredUrl) && probes.hasRedisServerBinary()) {
      return { url: await probes.startRedisServer(), source: 'redis-server' };
    }
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

/** What `machineProbes` started: the run's teardown stops them (test/support/test-run.ts). */
export const startedForRun: { stop(): Promise<unknown> }[] = [];

/** The probes of this machine, now. testcontainers is imported only when the earlier choices failed. */
export const machineProbes = (): RedisProbes => ({
  configuredUrl: process.env.REDIS_URL,
  ping: (url) => pingRedis(url),
  hasRedisServerBinary,
  async startRedisServer() {
    // Spawned detached and recorded (spawnChild): the run's teardown kills it even if this process dies.
    const server = await RedisServer.start();
    startedForRun.push(server);
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
    // Stopped by the run's teardown; testcontainers' reaper removes it if this process dies first.
    startedForRun.push(container);
    return container.getConnectionUrl();
  },
});

/**
 * The Redis the tests share: the one the run's globalSetup found (or started) and exported as
 * REDIS_URL with REDIS_URL_RESOLVED=1. Without that globalSetup (another jest config), found here once
 * per jest worker and kept in process.env; a server started then is killed by nobody but the
 * recorded-children teardown, so use the project's jest config.
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

/** Redis' clock in whole ms: the clock the script refills by and stamps `ts` with. */
export async function redisNow(client: Pick<Redis, 'time'>): Promise<number> {
  const [seconds, micros] = await client.time();
  return Number(seconds) * 1000 + Math.floor(Number(micros) / 1000);
}
