import { type ChildProcess, spawn } from 'node:child_process';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { setTimeout as sleep } from 'node:timers/promises';
import { Redis } from 'ioredis';

/**
 * Redis for the bench: a redis-server of its own on a free port (INFO cpu and INFO commandstats are
 * server-wide, so on a shared server they would count other people's work), and the INFO readings.
 */

export interface OwnRedis {
  url: string;
  child: ChildProcess;
  stop(): Promise<void>;
}

export function freePort(): Promise<number> {
  return new Promise((done, fail) => {
    const server = createServer();
    server.once('error', fail);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address() as { port: number };
      server.close(() => done(port));
    });
  });
}

/**
 * The wrapper shell starts redis-server and kills it when the shell's stdin (a pipe from the bench)
 * closes: when stop() ends it, and also when the bench process exits in any way (Ctrl-C, an error,
 * even SIGKILL), so no server outlives the run.
 */
const WRAPPER = [
  'exec 3<&0',
  'redis-server "$@" &',
  'pid=$!',
  '( cat <&3 >/dev/null; kill $pid 2>/dev/null ) &',
  'exec 3<&-',
  'wait $pid',
].join('\n');

/** Starts `redis-server --port N --save "" --appendonly no` on a free port and waits until it answers. */
export async function startOwnRedis(): Promise<OwnRedis> {
  let lastError: Error | undefined;
  for (let attempt = 0; attempt < 3; attempt++) {
    const port = await freePort();
    const args = ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'];
    args.push('--dir', tmpdir(), '--logfile', '', '--loglevel', 'warning', '--daemonize', 'no');
    const child = spawn('sh', ['-c', WRAPPER, 'redis-server', ...args], { stdio: ['pipe', 'ignore', 'inherit'] });
    const exited = new Promise<void>((done) => child.once('exit', () => done()));
    const stop = async () => {
      child.stdin?.end();
      if (child.exitCode !== null || child.signalCode !== null) return;
      const timer = setTimeout(() => child.kill('SIGKILL'), 5_000);
      await exited;
      clearTimeout(timer);
    };
    const url = `redis://127.0.0.1:${port}`;
    const probe = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null });
    probe.on('error', () => undefined);
    const deadline = Date.now() + 10_000;
    while (Date.now() < deadline && child.exitCode === null) {
      try {
        if (probe.status !== 'ready') await probe.connect();
        await probe.ping();
        probe.disconnect();
        return { url, child, stop };
      } catch (error) {
        lastError = error as Error;
        probe.disconnect();
        await sleep(100);
      }
    }
    probe.disconnect();
    await stop();
  }
  throw new Error(`could not start redis-server (is it on PATH?): ${lastError?.message ?? 'it exited'}`);
}

/** Redis main-thread CPU seconds (user + system) used so far. */
export async function redisCpuSeconds(redis: Redis): Promise<number> {
  const info = await redis.info('cpu');
  const field = (name: string) => Number(new RegExp(`^${name}:([\\d.]+)`, 'm').exec(info)?.[1] ?? NaN);
  const main = field('used_cpu_user_main_thread') + field('used_cpu_sys_main_thread');
  return Number.isFinite(main) ? main : field('used_cpu_user') + field('used_cpu_sys');
}

/** INFO commandstats: calls and µs per command name (lower case, without `cmdstat_`). */
export type CommandStats = Map<string, { calls: number; usec: number }>;

export async function commandStats(redis: Redis): Promise<CommandStats> {
  const info = await redis.info('commandstats');
  const stats: CommandStats = new Map();
  for (const match of info.matchAll(/^cmdstat_([^:]+):calls=(\d+),usec=(\d+)/gm)) {
    stats.set(match[1], { calls: Number(match[2]), usec: Number(match[3]) });
  }
  return stats;
}

/** The commands that run a script: what a limiter's decisions cost Redis is their µs. */
const SCRIPT_COMMANDS = ['evalsha', 'eval', 'evalsha_ro', 'eval_ro', 'fcall', 'fcall_ro'];

export interface ScriptCost {
  /** The script command(s) called in the interval, e.g. `evalsha` (several joined with `+`). */
  command: string;
  calls: number;
  usec: number;
}

/** What the script commands cost between two INFO commandstats readings. */
export function scriptCost(before: CommandStats, after: CommandStats): ScriptCost {
  let calls = 0;
  let usec = 0;
  const used: string[] = [];
  for (const name of SCRIPT_COMMANDS) {
    const a = after.get(name);
    if (!a) continue;
    const b = before.get(name) ?? { calls: 0, usec: 0 };
    if (a.calls - b.calls <= 0) continue;
    calls += a.calls - b.calls;
    usec += a.usec - b.usec;
    used.push(name);
  }
  return { command: used.join('+') || 'none', calls, usec };
}

export async function scanKeys(redis: Redis, pattern: string): Promise<string[]> {
  const found: string[] = [];
  let cursor = '0';
  do {
    const [next, keys] = await redis.scan(cursor, 'MATCH', pattern, 'COUNT', 1000);
    cursor = next;
    found.push(...keys);
  } while (cursor !== '0');
  return found;
}

export async function deleteKeys(redis: Redis, pattern: string): Promise<number> {
  const keys = await scanKeys(redis, pattern);
  for (let i = 0; i < keys.length; i += 500) await redis.del(...keys.slice(i, i + 500));
  return keys.length;
}
