import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { CHILDREN_DIR_ENV, killRecordedChildren } from './children.js';
import { findRedis, machineProbes, startedForRun } from './redis.js';

/**
 * What the jest run does before its first test file and after its last one (jest.config.js
 * globalSetup / globalTeardown, through global-setup.mjs and global-teardown.mjs). In the jest
 * process itself, whose process.env the test workers inherit.
 *
 * Setup: a directory where every child the tests spawn is recorded (test/support/children.ts), then
 * one Redis for the whole run (findRedis: REDIS_URL, 127.0.0.1:6379, a redis-server of its own, a
 * container), exported as REDIS_URL with REDIS_URL_RESOLVED=1 so that `redisUrl()` asks nothing.
 * Teardown: stops what setup started and kills every recorded process group still running, also
 * when the jest process exits early or is interrupted (SIGINT, SIGTERM).
 */

let childrenDir: string | undefined;

function killLeftovers(reason: string): void {
  if (!childrenDir) return;
  const killed = killRecordedChildren(childrenDir);
  if (killed.length > 0 && process.env.RL_TEST_QUIET_TEARDOWN !== '1') {
    process.stderr.write(
      `\n[test run] ${reason}: killed ${killed.length} process group(s) the tests left running:\n  ${killed.join('\n  ')}\n`,
    );
  }
}

function onSignal(signal: NodeJS.Signals): void {
  killLeftovers(`jest got ${signal}`);
  process.exit(signal === 'SIGINT' ? 130 : 143);
}

function onExit(): void {
  killLeftovers('jest exited');
  if (childrenDir) rmSync(childrenDir, { recursive: true, force: true });
}

export async function setUpTestRun(): Promise<void> {
  childrenDir = mkdtempSync(join(tmpdir(), 'rl-test-children-'));
  process.env[CHILDREN_DIR_ENV] = childrenDir;
  process.once('exit', onExit);
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  try {
    const { url, source } = await findRedis(machineProbes());
    if (source !== '127.0.0.1:6379' && source !== 'REDIS_URL') {
      const asked = process.env.REDIS_URL ? ` (REDIS_URL=${process.env.REDIS_URL} does not answer)` : '';
      process.stderr.write(`\n[test run] Redis for this run: ${source} at ${url}${asked}\n`);
    }
    process.env.REDIS_URL = url;
    process.env.REDIS_URL_RESOLVED = '1';
  } catch (error) {
    // Jest runs no globalTeardown after a failed globalSetup.
    await tearDownTestRun();
    throw error;
  }
}

export async function tearDownTestRun(): Promise<void> {
  await Promise.allSettled(startedForRun.splice(0).map((started) => started.stop()));
  killLeftovers('teardown');
  if (childrenDir) rmSync(childrenDir, { recursive: true, force: true });
  childrenDir = undefined;
  delete process.env[CHILDREN_DIR_ENV];
  process.removeListener('exit', onExit);
  process.removeListener('SIGINT', onSignal);
  process.removeListener('SIGTERM', onSignal);
}
