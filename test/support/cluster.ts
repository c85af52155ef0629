import type { ChildProcess } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Cluster, type ClusterOptions, Redis } from 'ioredis';
import { killChild, signalChild, spawnChild } from './children.js';
import { freePort, pingRedis } from './redis.js';

/**
 * A local Redis Cluster for tests: `redis-server --cluster-enabled yes` processes on free ports,
 * joined with CLUSTER MEET and given slot ranges with CLUSTER ADDSLOTS (no redis-cli, no Docker).
 * Masters only: the tests need slots spread over nodes, not fail-over.
 */

const SLOTS = 16384;
/** Redis puts a node's cluster bus on its port + 10000. */
const BUS_OFFSET = 10_000;

function portIsFree(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const server = createServer();
    server.unref();
    server.once('error', () => resolve(false));
    server.listen(port, '127.0.0.1', () => server.close(() => resolve(true)));
  });
}

/** A free port whose cluster-bus port (+10000) is free too. */
async function freeNodePort(): Promise<number> {
  for (let attempt = 0; attempt < 50; attempt++) {
    const port = await freePort();
    if (port + BUS_OFFSET <= 65535 && (await portIsFree(port + BUS_OFFSET))) return port;
  }
  throw new Error('no free port pair (port, port + 10000) for a cluster node');
}

async function waitFor(what: string, check: () => Promise<boolean>, timeoutMs = 15_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (await check()) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`local Redis Cluster: ${what} within ${timeoutMs} ms`);
}

export interface ClusterNode {
  host: string;
  port: number;
}

export class LocalCluster {
  private constructor(
    readonly nodes: ClusterNode[],
    private readonly processes: ChildProcess[],
    private readonly dir: string,
  ) {}

  /** Starts `masters` nodes, splits the slots between them in equal ranges and waits for cluster_state:ok. */
  static async start(masters = 3): Promise<LocalCluster> {
    const dir = await mkdtemp(join(tmpdir(), 'rl-test-cluster-'));
    const ports: number[] = [];
    for (let i = 0; i < masters; i++) {
      let port: number;
      do port = await freeNodePort();
      while (ports.includes(port) || ports.includes(port + BUS_OFFSET) || ports.includes(port - BUS_OFFSET));
      ports.push(port);
    }
    // Each node in a process group of its own, recorded: the run's teardown kills any a test leaves.
    const processes = ports.map((port) =>
      spawnChild(
        'redis-server',
        [
          '--port',
          String(port),
          '--bind',
          '127.0.0.1',
          '--cluster-enabled',
          'yes',
          '--cluster-config-file',
          join(dir, `nodes-${port}.conf`),
          '--cluster-node-timeout',
          '5000',
          '--dir',
          dir,
          '--save',
          '',
          '--appendonly',
          'no',
        ],
        { stdio: 'ignore' },
      ),
    );
    for (const child of processes) child.unref();
    const cluster = new LocalCluster(
      ports.map((port) => ({ host: '127.0.0.1', port })),
      processes,
      dir,
    );
    try {
      await cluster.join();
    } catch (error) {
      await cluster.stop();
      throw error;
    }
    return cluster;
  }

  private async join(): Promise<void> {
    await waitFor('every node answers PING', async () => {
      if (this.processes.some((p) => p.exitCode !== null)) throw new Error('a redis-server node exited at start-up');
      return (await Promise.all(this.nodes.map((n) => pingRedis(`redis://${n.host}:${n.port}`, 500)))).every(Boolean);
    });
    const admins = this.nodes.map((n) => new Redis({ host: n.host, port: n.port }));
    try {
      for (const node of this.nodes.slice(1)) await admins[0].call('CLUSTER', 'MEET', node.host, node.port);
      const per = Math.ceil(SLOTS / this.nodes.length);
      await Promise.all(
        admins.map((admin, i) => {
          const first = i * per;
          const last = Math.min(SLOTS, first + per) - 1;
          const slots = Array.from({ length: last - first + 1 }, (_, k) => first + k);
          return admin.call('CLUSTER', 'ADDSLOTS', ...slots);
        }),
      );
      await waitFor('cluster_state:ok and every master known to every node', async () => {
        const states = await Promise.all(
          admins.map(async (admin) => {
            const info = String(await admin.call('CLUSTER', 'INFO'));
            // <id> <ip:port@bus> <flags> <master> <ping> <pong> <epoch> <link> <slots...>
            const masters = String(await admin.call('CLUSTER', 'NODES'))
              .split('\n')
              .map((line) => line.trim().split(' '))
              .filter((f) => f.length > 8 && f[2].split(',').includes('master') && f[7] === 'connected');
            return info.includes('cluster_state:ok') && masters.length === this.nodes.length;
          }),
        );
        return states.every(Boolean);
      });
    } finally {
      admins.forEach((admin) => admin.disconnect());
    }
  }

  /**
   * A ready client for the cluster (you close it). Without an offline queue by default, as the README
   * advises for a client given to RateLimitModule.
   */
  async client(options: ClusterOptions = {}): Promise<Cluster> {
    const client = new Cluster(this.nodes, { enableOfflineQueue: false, ...options });
    await new Promise<void>((resolve, reject) => {
      client.once('ready', () => resolve());
      client.once('end', () => reject(new Error('cluster client ended before it was ready')));
    });
    return client;
  }

  /** Sends a signal to one node (SIGSTOP / SIGCONT to freeze and thaw it). */
  signal(node: number, signal: NodeJS.Signals): void {
    signalChild(this.processes[node], signal);
  }

  /** Kills every node and deletes their cluster config files. */
  async stop(): Promise<void> {
    await Promise.all(this.processes.map((child) => killChild(child)));
    await rm(this.dir, { recursive: true, force: true });
  }
}
