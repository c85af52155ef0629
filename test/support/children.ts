import { type ChildProcess, execFileSync, spawn, type SpawnOptions } from 'node:child_process';
import { appendFileSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { basename, join } from 'node:path';

/**
 * Processes the tests start (redis-server instances, worker apps), in process groups of their own,
 * recorded so that the run's globalTeardown kills every group a test left behind.
 *
 * Jest runs each test file in a `process` of its own, so `process.on('exit')` in a test never fires,
 * and a jest worker that is force-killed cannot clean up after itself. So each child is spawned
 * detached (its own process group) and recorded as a file `<pid>` in RL_TEST_CHILDREN_DIR, a
 * directory the globalSetup creates (test/support/test-run.ts); the file goes when the child exits.
 * The globalTeardown (and the jest process's own exit) kills the groups still recorded.
 */
export const CHILDREN_DIR_ENV = 'RL_TEST_CHILDREN_DIR';

/**
 * A file to which every spawn appends a line `<pid> <command> <args...>`, never removed: how
 * test/module/leaks/no-leaks.e2e-spec.ts finds every child of the run it checks.
 */
export const SPAWN_LOG_ENV = 'RL_TEST_SPAWN_LOG';

/** Children spawned in a group of their own. */
const detached = new WeakSet<ChildProcess>();

interface ChildRecord {
  pid: number;
  /** The program's base name (`redis-server`, `node`): a group is killed only if it still runs it. */
  command: string;
}

/**
 * Spawns `command` detached, in a process group of its own whose id is the child's pid, and records
 * it for the teardown. Without RL_TEST_CHILDREN_DIR (a jest config without the run's globalSetup) it
 * is spawned as usual, in the test's own group.
 */
export function spawnChild(command: string, args: string[], options: SpawnOptions = {}): ChildProcess {
  const dir = process.env[CHILDREN_DIR_ENV];
  const child = spawn(command, args, { ...options, detached: dir !== undefined });
  if (dir !== undefined) detached.add(child);
  // A failed spawn (ENOENT) is reported by the caller's 'error' handler; keep it from throwing here.
  child.once('error', () => undefined);
  const log = process.env[SPAWN_LOG_ENV];
  if (log && child.pid !== undefined) appendFileSync(log, `${child.pid} ${basename(command)} ${args.join(' ')}\n`);
  if (dir && child.pid !== undefined) {
    const file = join(dir, String(child.pid));
    const record: ChildRecord = { pid: child.pid, command: basename(command) };
    try {
      writeFileSync(file, JSON.stringify(record));
      child.once('exit', () => rmSync(file, { force: true }));
    } catch {
      // The run is over (its directory is gone): the child is killed below by its owner, or by nobody.
    }
  }
  return child;
}

/** Whether `child` has not exited yet. */
export function isRunning(child: ChildProcess): boolean {
  return child.pid !== undefined && child.exitCode === null && child.signalCode === null;
}

/** Sends `signal` to the child's process group (to the child alone when it was not spawned detached). */
export function signalChild(child: ChildProcess, signal: NodeJS.Signals): void {
  if (child.pid === undefined) return;
  try {
    if (detached.has(child)) process.kill(-child.pid, signal);
    else child.kill(signal);
  } catch {
    // Already gone (ESRCH), or the group was never made: fall back to the process itself.
    try {
      child.kill(signal);
    } catch {
      // Gone.
    }
  }
}

/**
 * Kills the child's group (after SIGCONT, so that a frozen process dies at once) and waits until
 * the child has exited.
 */
export async function killChild(child: ChildProcess, signal: NodeJS.Signals = 'SIGKILL'): Promise<void> {
  if (!isRunning(child)) return;
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  signalChild(child, 'SIGCONT');
  signalChild(child, signal);
  await exited;
}

/**
 * Every live process: pid, process group and command line (`ps`, on Linux and macOS). Zombies (dead,
 * not yet reaped by their parent) are left out: they hold no port and no CPU.
 */
export function listProcesses(): { pid: number; pgid: number; args: string }[] {
  const out = execFileSync('ps', ['-A', '-ww', '-o', 'pid=,pgid=,stat=,args='], { encoding: 'utf8' });
  return out
    .split('\n')
    .map((line) => /^\s*(\d+)\s+(\d+)\s+(\S+)\s+(.*)$/.exec(line))
    .filter((m): m is RegExpExecArray => m !== null && !m[3].startsWith('Z'))
    .map((m) => ({ pid: Number(m[1]), pgid: Number(m[2]), args: m[4] }));
}

function recorded(dir: string): ChildRecord[] {
  let names: string[];
  try {
    names = readdirSync(dir);
  } catch {
    return [];
  }
  const records: ChildRecord[] = [];
  for (const name of names) {
    try {
      records.push(JSON.parse(readFileSync(join(dir, name), 'utf8')) as ChildRecord);
    } catch {
      // Removed meanwhile, or half-written by a dying worker: the next listing decides.
    }
  }
  return records;
}

/**
 * Kills, with SIGCONT then SIGKILL, every recorded process group that still runs its command, and
 * waits (up to 5 s) until they are gone. Synchronous, so that it can run in an 'exit' handler.
 * Returns a line per group it killed.
 */
export function killRecordedChildren(dir: string): string[] {
  const killed: string[] = [];
  const records = recorded(dir);
  if (records.length === 0) return killed;
  const groups = new Set<number>();
  for (const { pid, command } of records) {
    const members = listProcesses().filter((p) => p.pgid === pid);
    // A pid whose group is gone, or now runs something else (a reused pid), is not ours to kill.
    if (!members.some((p) => p.args.includes(command))) continue;
    for (const signal of ['SIGCONT', 'SIGKILL'] as const) {
      try {
        process.kill(-pid, signal);
      } catch {
        // Gone meanwhile.
      }
    }
    groups.add(pid);
    killed.push(`${members.map((p) => `${p.pid} ${p.args}`).join('; ')}`);
  }
  const deadline = Date.now() + 5_000;
  while (groups.size > 0 && Date.now() < deadline) {
    const alive = new Set(listProcesses().map((p) => p.pgid));
    for (const group of groups) if (!alive.has(group)) groups.delete(group);
    if (groups.size > 0) execFileSync('sleep', ['0.05']);
  }
  for (const { pid } of records) rmSync(join(dir, String(pid)), { force: true });
  return killed;
}
