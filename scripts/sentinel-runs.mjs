#!/usr/bin/env node
/**
 * `node scripts/sentinel-runs.mjs`: the Sentinel figures of docs/guides/redis-sentinel.md, measured
 * (test/redis/sentinel/sentinel-runs.measure.ts): 20 runs with the master SIGKILLed (when decisions
 * reach the new master after Sentinel's switch; every run within the guide's 1000 ms, or it fails),
 * then `SENTINEL FAILOVER` at R = 10 and R = 20/s (the switch delay and the admissions beyond B + R·T).
 * Each run has a deployment of its own (test/support/sentinel.ts: redis-server on free ports), one after
 * the other: about 15 s a run, 8 minutes in all. Not part of `npm test`.
 *
 * The measure file is a jest file that no project of jest.config.js matches: this script gives jest the
 * timing project's settings with that one file, in band. SENTINEL_KILL_RUNS and SENTINEL_FAILOVER_RUNS
 * (per rate) change the counts; arguments after `--` go to jest (e.g. `-- -t kill` for the kill runs only).
 */
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const { default: config } = await import(join(root, 'jest.config.js'));
const timing = config.projects.find((project) => project.displayName === 'timing');
const measure = {
  ...timing,
  rootDir: root,
  displayName: 'sentinel-runs',
  testMatch: ['<rootDir>/test/redis/sentinel/sentinel-runs.measure.ts'],
  testTimeout: 3_600_000,
};
const dir = mkdtempSync(join(tmpdir(), 'rl-sentinel-runs-'));
const file = join(dir, 'jest.config.json');
writeFileSync(file, JSON.stringify(measure));
const jest = createRequire(import.meta.url).resolve('jest/bin/jest');
const args = ['--experimental-vm-modules', jest, '--config', file, '--runInBand', ...process.argv.slice(2).filter((a) => a !== '--')];
const child = spawn(process.execPath, args, { stdio: 'inherit', cwd: root });
child.on('close', (code, signal) => {
  rmSync(dir, { recursive: true, force: true });
  process.exit(code ?? (signal ? 1 : 0));
});
