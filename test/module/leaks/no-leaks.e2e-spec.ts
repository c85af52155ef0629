import { execFileSync } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { readdirSync, readFileSync } from 'node:fs';
import { mkdtemp, readdir, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { killChild, listProcesses, SPAWN_LOG_ENV, spawnChild } from '../../support/children.js';
import { freePort } from '../../support/redis.js';
import type { LeakReport } from './fixtures/report.js';

/**
 * No redis-server or app process outlives a jest run, even with no Redis to use.
 *
 * Runs a small jest run of its own (test/module/leaks/jest.config.js: the project's globalSetup and
 * globalTeardown, two fixture files in two jest workers) with REDIS_URL on a loopback port where
 * nothing listens, so the run must start its own redis-server. The fixtures start a redis-server, a
 * frozen (SIGSTOP) redis-server, a Redis Cluster node and an app process, and stop none of them, as a
 * test that fails before its afterAll would. Once the run is over:
 * - no process may be left in the process group of any child the run spawned (every spawn through
 *   test/support/children.ts is logged to a file, RL_TEST_SPAWN_LOG), nor in those the fixtures
 *   reported (the run's Redis, found by INFO, included);
 * - no process may carry the marker the run's environment holds, which whatever it spawns inherits:
 *   this catches Node processes (apps, jest workers) started some other way. Not redis-server, which
 *   overwrites its environment with its process title.
 *
 * Fails, for example, when the globalTeardown does not kill the recorded children
 * (test/support/test-run.ts), or when children are spawned without being recorded.
 */

const ROOT = fileURLToPath(new URL('../../../', import.meta.url));
const JEST = join(ROOT, 'node_modules/jest/bin/jest.js');
const MARK = 'RL_LEAK_MARK';

/** Live processes whose environment holds `MARK=marker` (Linux /proc, else `ps e`). */
function marked(marker: string): { pid: number; args: string }[] {
  const needle = `${MARK}=${marker}`;
  let pids: number[];
  try {
    pids = readdirSync('/proc')
      .filter((name) => /^\d+$/.test(name))
      .map(Number);
  } catch {
    const out = execFileSync('ps', ['-A', '-ww', '-E', '-o', 'pid=,command='], { encoding: 'utf8' });
    return out
      .split('\n')
      .filter((line) => line.includes(needle))
      .map((line) => ({ pid: Number(line.trim().split(/\s+/)[0]), args: line.trim() }));
  }
  const found: { pid: number; args: string }[] = [];
  for (const pid of pids) {
    try {
      if (!readFileSync(`/proc/${pid}/environ`, 'latin1').split('\0').includes(needle)) continue;
      const state = /^\d+ \(.*\) (\S)/.exec(readFileSync(`/proc/${pid}/stat`, 'latin1'))?.[1];
      if (state === 'Z') continue; // Dead, not yet reaped.
      found.push({ pid, args: readFileSync(`/proc/${pid}/cmdline`, 'latin1').split('\0').join(' ').trim() });
    } catch {
      // Gone meanwhile, or not ours to read.
    }
  }
  return found;
}

function killGroups(pids: number[]): void {
  for (const pid of pids) {
    for (const target of [-pid, pid]) {
      for (const signal of ['SIGCONT', 'SIGKILL'] as const) {
        try {
          process.kill(target, signal);
        } catch {
          // Gone.
        }
      }
    }
  }
}

describe('no process outlives a jest run', () => {
  const marker = randomUUID();
  let reportDir: string;
  let reports: LeakReport[] = [];
  let output = '';
  let exitCode: number | null = null;
  let deadUrl: string;
  let survivors: { pid: number; args: string }[] = [];
  let groupSurvivors: string[] = [];
  let spawned: { pid: number; line: string }[] = [];

  beforeAll(async () => {
    reportDir = await mkdtemp(join(tmpdir(), 'rl-test-leaks-'));
    deadUrl = `redis://127.0.0.1:${await freePort()}`;
    const env: NodeJS.ProcessEnv = {
      ...process.env,
      NODE_OPTIONS: '--experimental-vm-modules',
      REDIS_URL: deadUrl,
      [MARK]: marker,
      LEAK_REPORT_DIR: reportDir,
      [SPAWN_LOG_ENV]: join(reportDir, 'spawned.log'),
      RL_TEST_QUIET_TEARDOWN: '1',
    };
    delete env.REDIS_URL_RESOLVED;
    delete env.RL_TEST_CHILDREN_DIR;
    delete env.JEST_WORKER_ID;
    const child = spawnChild(process.execPath, [JEST, '-c', 'test/module/leaks/jest.config.js', '--ci', '--colors=false'], {
      cwd: ROOT,
      env,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    child.stdout!.on('data', (chunk: Buffer) => (output += chunk.toString()));
    child.stderr!.on('data', (chunk: Buffer) => (output += chunk.toString()));
    const timer = setTimeout(() => void killChild(child), 50_000);
    exitCode = await new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
    clearTimeout(timer);
    spawned = (await readFile(join(reportDir, 'spawned.log'), 'utf8').catch(() => ''))
      .split('\n')
      .filter(Boolean)
      .map((line) => ({ pid: Number(line.split(' ')[0]), line }));
    reports = await Promise.all(
      (await readdir(reportDir))
        .filter((name) => name.endsWith('.json'))
        .map(async (name) => JSON.parse(await readFile(join(reportDir, name), 'utf8')) as LeakReport),
    );
    // The run is over when its jest process has exited; give a jest worker it killed a moment to go.
    for (let waited = 0; waited <= 2_000; waited += 100) {
      survivors = marked(marker);
      if (survivors.length === 0) break;
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    const groups = new Set([...spawned.map((s) => s.pid), ...reports.flatMap((r) => [...r.pids, r.sharedRedisPid])]);
    groupSurvivors = listProcesses()
      .filter((p) => groups.has(p.pgid) || groups.has(p.pid))
      .map((p) => `${p.pid} (group ${p.pgid}) ${p.args}`);
  }, 60_000);

  afterAll(async () => {
    // Whatever the outcome, leave nothing behind: this file's own leak check must not leak.
    killGroups([...survivors.map((s) => s.pid), ...spawned.map((s) => s.pid), ...reports.flatMap((r) => [...r.pids, r.sharedRedisPid])]);
    await rm(reportDir, { recursive: true, force: true });
  });

  it('ran the fixtures to success, on a redis-server the run started because REDIS_URL did not answer', () => {
    expect({ exitCode, output: exitCode === 0 ? '' : output }).toEqual({ exitCode: 0, output: '' });
    expect(reports.map((r) => r.file).sort()).toEqual(['frozen', 'servers']);
    for (const r of reports) {
      expect(r.redisUrl).toMatch(/^redis:\/\/127\.0\.0\.1:\d+$/);
      expect(r.redisUrl).not.toBe(deadUrl);
      expect(r.pids).toHaveLength(2);
    }
    // One Redis for the whole run: both files, in two jest workers, used the same server.
    expect(new Set(reports.map((r) => r.redisUrl)).size).toBe(1);
    expect(new Set(reports.map((r) => r.sharedRedisPid)).size).toBe(1);
    // Every process the fixtures reported, and the run's Redis, went through the spawn log.
    const logged = new Set(spawned.map((s) => s.pid));
    for (const pid of reports.flatMap((r) => [...r.pids, r.sharedRedisPid])) expect([pid, logged.has(pid)]).toEqual([pid, true]);
  });

  it('leaves no Node process of that run alive (app, jest worker): none carries its marker', () => {
    expect(survivors).toEqual([]);
  });

  it('leaves no process in the group of any child the run spawned: its Redis, the servers and apps of the fixtures', () => {
    expect(spawned.length).toBeGreaterThanOrEqual(5);
    expect(groupSurvivors).toEqual([]);
  });
});
