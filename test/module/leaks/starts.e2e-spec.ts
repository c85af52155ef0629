import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { startAll, startWorkers } from '../../support/processes.js';
import { RedisServer, START_TRIES } from '../../support/redis.js';

/**
 * Starts that fail leave nothing running: a redis-server that never answers is killed before
 * `RedisServer.start()` throws, and when one of several workers fails to start, the others that came
 * up are stopped before `startWorkers()` rejects.
 */

const TINY_APP = fileURLToPath(new URL('./fixtures/tiny-app.mjs', import.meta.url));

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

describe('RedisServer.start() kills its child before it throws', () => {
  it('kills a server that runs but never answers PING (it asks for a password) once the start gives up', async () => {
    const failure = RedisServer.start(['--requirepass', 'never-given'], 1_000);
    await expect(failure).rejects.toThrow(/^redis-server \(pid \d+\) on port \d+ did not answer within 1000 ms$/);
    const pid = Number(/pid (\d+)/.exec(((await failure.catch((e: unknown) => e)) as Error).message)![1]);
    expect(alive(pid)).toBe(false);
  });

  it('says so when the server exits at start-up, every time it is started on another port', async () => {
    await expect(RedisServer.start(['--no-such-option', 'x'])).rejects.toThrow(
      new RegExp(
        `^${START_TRIES} starts failed: ${Array(START_TRIES).fill('redis-server \\(pid \\d+\\) on port \\d+ exited with 1 before it answered').join('; ')}$`,
      ),
    );
  });
});

describe('startAll() stops every start that succeeded when one fails', () => {
  it('stops the two that came up, after the slow one is up too, and rejects with the failure', async () => {
    const events: string[] = [];
    const start = async (name: string) => {
      await new Promise((resolve) => setTimeout(resolve, name === 'slow' ? 100 : 10));
      if (name === 'bad') {
        events.push('bad failed');
        throw new Error('bad did not start');
      }
      events.push(`${name} up`);
      return { stop: async () => void events.push(`${name} stopped`) };
    };
    await expect(startAll(['fast', 'bad', 'slow'], start)).rejects.toThrow('bad did not start');
    expect(events).toEqual(['fast up', 'bad failed', 'slow up', 'fast stopped', 'slow stopped']);
  });

  it('returns every start, in order, when none fails', async () => {
    const started = await startAll([3, 1, 2], async (n) => {
      await new Promise((resolve) => setTimeout(resolve, n * 10));
      return { n, stop: async () => undefined };
    });
    expect(started.map((s) => s.n)).toEqual([3, 1, 2]);
  });

  it('with real processes: the app that listened is stopped when the other exits before listening', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'rl-test-starts-'));
    try {
      const up = join(dir, 'up');
      const failure = startWorkers(TINY_APP, [
        { redisUrl: 'redis://unused', keyPrefix: up, platform: 'express' },
        { redisUrl: 'redis://unused', keyPrefix: 'fail-to-start', platform: 'express' },
      ]);
      await expect(failure).rejects.toThrow(/worker app exited \(3\) before it listened:\ntiny app: told to fail/);
      const pid = Number(await readFile(`${up}.pid`, 'utf8'));
      expect(pid).toBeGreaterThan(0);
      expect(alive(pid)).toBe(false);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});
