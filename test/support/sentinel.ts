import type { ChildProcess } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { Redis } from 'ioredis';
import { isRunning, killChild, signalChild, spawnChild } from './children.js';
import { ExitedAtStartUp, freePort, pingRedis, startOnFreePorts } from './redis.js';

/**
 * A local Sentinel deployment for tests: a master and a replica (`redis-server --replicaof`), and three
 * `redis-server --sentinel` processes monitoring the master (quorum 2, down-after-milliseconds 1000),
 * all on free ports of 127.0.0.1, their config files in a temporary directory. No Docker, and the
 * shared Redis is never touched. Every process is spawned by `spawnChild`, so the run's teardown kills
 * any a test leaves behind.
 */

export const MASTER_NAME = 'rl-test-master';
/** Sentinel's `down-after-milliseconds`: a master silent this long is subjectively down. */
export const DOWN_AFTER_MS = 1000;
const FAILOVER_TIMEOUT_MS = 3000;

export interface Address {
  host: string;
  port: number;
}

/** One redis-server process of the deployment (a data node or a sentinel). */
class Node {
  constructor(
    readonly port: number,
    /** The running process; replaced by `restart()`. */
    public child: ChildProcess,
    /** Where it logs: why it exited, when it did. */
    readonly logFile: string,
    /** How it was started: `restart()` starts it again so. */
    private readonly start?: () => ChildProcess,
  ) {}

  /**
   * Starts the process again with the same command line (the same port), after it was killed; resolves
   * when it answers PING, with that moment (`performance.now()`).
   */
  async restart(timeoutMs = 10_000): Promise<number> {
    if (this.start === undefined) throw new Error(`port ${this.port}: no command line to restart`);
    if (isRunning(this.child)) await this.stop();
    this.child = this.start();
    this.child.unref();
    const deadline = performance.now() + timeoutMs;
    while (performance.now() < deadline) {
      if (await pingRedis(this.url, 200)) return performance.now();
      if (!isRunning(this.child)) throw new Error(`port ${this.port}: the restarted process exited with ${this.child.exitCode}`);
      await new Promise((r) => setTimeout(r, 10));
    }
    throw new Error(`port ${this.port}: the restarted process did not answer within ${timeoutMs} ms`);
  }

  get url(): string {
    return `redis://127.0.0.1:${this.port}`;
  }

  signal(signal: NodeJS.Signals): void {
    signalChild(this.child, signal);
  }

  stop(): Promise<void> {
    return killChild(this.child);
  }
}

/** Waits until `check` answers true; `failIf` throws at once when waiting longer is pointless (a process exited). */
async function waitFor(what: string, check: () => Promise<boolean>, failIf: () => void, timeoutMs = 20_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    failIf();
    if (await check().catch(() => false)) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`local Sentinel deployment: ${what} within ${timeoutMs} ms`);
}

/** `SENTINEL ...` replies are flat arrays of field, value: an object of them. */
function fields(reply: unknown): Record<string, string> {
  const list = reply as string[];
  const out: Record<string, string> = {};
  for (let i = 0; i + 1 < list.length; i += 2) out[list[i]] = list[i + 1];
  return out;
}

export class LocalSentinels {
  private constructor(
    /** [0]: started as the master, [1]: started as its replica. */
    readonly servers: Node[],
    readonly sentinels: Node[],
    private readonly dir: string,
  ) {}

  /** The `redis` option of RateLimitModule (or ioredis) for this deployment. */
  get options(): { sentinels: Address[]; name: string } {
    return { sentinels: this.sentinels.map((s) => ({ host: '127.0.0.1', port: s.port })), name: MASTER_NAME };
  }

  /** The server started as the master, and the one started as its replica. */
  get master(): Node {
    return this.servers[0];
  }

  get replica(): Node {
    return this.servers[1];
  }

  /**
   * Starts the master, its replica and three sentinels, and waits until the replica is in sync and every
   * sentinel knows the replica and the two other sentinels (so that a failover can be voted and done:
   * about 5 s, Sentinel's hello messages go every 2 s). With `{ failover: false }`, only until every
   * process answers: enough for a test in which the master stays where it is.
   */
  static async start({
    failover = true,
    port = freePort,
  }: { failover?: boolean; port?: () => Promise<number> } = {}): Promise<LocalSentinels> {
    return startOnFreePorts(() => LocalSentinels.startOnce(failover, port), 'local Sentinel deployment: ');
  }

  /** One start on five ports from `port`; throws ExitedAtStartUp when a process exits (its port was taken, most likely). */
  private static async startOnce(failover: boolean, port: () => Promise<number>): Promise<LocalSentinels> {
    const dir = await mkdtemp(join(tmpdir(), 'rl-test-sentinel-'));
    const ports: number[] = [];
    while (ports.length < 5) {
      const next = await port();
      if (!ports.includes(next)) ports.push(next);
    }
    const logFile = (p: number) => join(dir, `${p}.log`);
    const server = (p: number, extra: string[] = []) =>
      spawnChild(
        'redis-server',
        ['--port', String(p), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', dir, '--logfile', logFile(p), ...extra],
        { stdio: 'ignore' },
      );
    const deployment = new LocalSentinels([], [], dir);
    try {
      const replicaOf = ['--replicaof', '127.0.0.1', String(ports[0])];
      deployment.servers.push(
        new Node(ports[0], server(ports[0]), logFile(ports[0]), () => server(ports[0])),
        new Node(ports[1], server(ports[1], replicaOf), logFile(ports[1]), () => server(ports[1], replicaOf)),
      );
      for (const p of ports.slice(2)) {
        const file = join(dir, `sentinel-${p}.conf`);
        await writeFile(
          file,
          [
            `port ${p}`,
            'bind 127.0.0.1',
            `dir ${dir}`,
            `logfile ${logFile(p)}`,
            `sentinel monitor ${MASTER_NAME} 127.0.0.1 ${ports[0]} 2`,
            `sentinel down-after-milliseconds ${MASTER_NAME} ${DOWN_AFTER_MS}`,
            `sentinel failover-timeout ${MASTER_NAME} ${FAILOVER_TIMEOUT_MS}`,
            `sentinel parallel-syncs ${MASTER_NAME} 1`,
            '',
          ].join('\n'),
        );
        deployment.sentinels.push(new Node(p, spawnChild('redis-server', [file, '--sentinel'], { stdio: 'ignore' }), logFile(p)));
      }
      for (const node of [...deployment.servers, ...deployment.sentinels]) node.child.unref();
      await deployment.ready(failover);
      return deployment;
    } catch (error) {
      await deployment.stop();
      throw error;
    }
  }

  /** Throws ExitedAtStartUp, naming the process and the last line it logged, when one of them exited. */
  private failIfExited(): void {
    const exited = [...this.servers, ...this.sentinels].find((n) => !isRunning(n.child));
    if (exited === undefined) return;
    const role = this.sentinels.includes(exited) ? 'sentinel' : exited === this.master ? 'master' : 'replica';
    let said = '';
    try {
      said = readFileSync(exited.logFile, 'utf8').trim().split('\n').pop() ?? '';
    } catch {
      // It logged nothing.
    }
    throw new ExitedAtStartUp(
      `the ${role} on port ${exited.port} exited with ${exited.child.exitCode ?? exited.child.signalCode} at start-up` +
        (said ? ` (it logged: ${said})` : ''),
    );
  }

  private async ready(failover: boolean): Promise<void> {
    const all = [...this.servers, ...this.sentinels];
    const failIf = () => this.failIfExited();
    await waitFor(
      'every process answers PING',
      async () => (await Promise.all(all.map((n) => pingRedis(n.url, 500)))).every(Boolean),
      failIf,
    );
    if (!failover) return;
    await waitFor(
      'the replica in sync and known to every sentinel, every sentinel known to the others',
      async () => {
        const replication = await this.ask(this.replica.port, (c) => c.info('replication'));
        if (!/master_link_status:up/.test(String(replication))) return false;
        const known = await Promise.all(
          this.sentinels.map((s) =>
            this.ask(s.port, async (c) => {
              const replicas = (await c.call('SENTINEL', 'REPLICAS', MASTER_NAME)) as unknown[];
              const others = (await c.call('SENTINEL', 'SENTINELS', MASTER_NAME)) as unknown[];
              const replicaOk = replicas.map(fields).some((r) => Number(r.port) === this.replica.port && r.flags === 'slave');
              return replicaOk && others.length === 2;
            }),
          ),
        );
        return known.every(Boolean);
      },
      failIf,
    );
  }

  /** Runs `fn` on a throwaway connection to 127.0.0.1:`port`. */
  async ask<T>(port: number, fn: (client: Redis) => Promise<T>): Promise<T> {
    const client = new Redis({ host: '127.0.0.1', port, lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null });
    client.on('error', () => undefined);
    try {
      await client.connect();
      return await fn(client);
    } finally {
      client.disconnect();
    }
  }

  /** The master's address as the first sentinel that answers tells it. */
  async masterPort(): Promise<number> {
    for (const s of this.sentinels) {
      try {
        const reply = (await this.ask(s.port, (c) => c.call('SENTINEL', 'GET-MASTER-ADDR-BY-NAME', MASTER_NAME))) as string[];
        return Number(reply[1]);
      } catch {
        // The next one.
      }
    }
    throw new Error('no sentinel answered');
  }

  /** `SENTINEL FAILOVER`: a graceful failover, the master still running. */
  async failover(): Promise<void> {
    await this.ask(this.sentinels[0].port, (c) => c.call('SENTINEL', 'FAILOVER', MASTER_NAME));
  }

  /**
   * Listens to every sentinel's events on the master (`+switch-master`, `+selected-slave`, ...): the
   * first time each was seen, on `performance.now()`. `stop()` closes the connections.
   */
  watch(): { seen: Map<string, number>; stop: () => void } {
    const seen = new Map<string, number>();
    const clients = this.sentinels.map((s) => {
      const client = new Redis({ host: '127.0.0.1', port: s.port, maxRetriesPerRequest: 0, retryStrategy: () => null });
      client.on('error', () => undefined);
      void client.psubscribe('*').catch(() => undefined);
      client.on('pmessage', (_pattern: string, channel: string) => {
        if (!seen.has(channel)) seen.set(channel, performance.now());
      });
      return client;
    });
    return { seen, stop: () => clients.forEach((c) => c.disconnect()) };
  }

  /** Kills every process and deletes the config files. */
  async stop(): Promise<void> {
    await Promise.all([...this.servers, ...this.sentinels].map((n) => n.stop()));
    await rm(this.dir, { recursive: true, force: true });
  }
}
