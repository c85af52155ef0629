#!/usr/bin/env node
/**
 * `npm test`: lint and type-check, then the three jest projects (jest.config.js).
 *
 * 1. `npm run check` (lint and type-check side by side); a failure stops here.
 * 2. `fast`, with the machine to itself.
 * 3. `timing` in band and, beside it, `package` at a low CPU priority (nice 10, see NICE). The timing files
 *    mostly wait (on timers, on a frozen Redis, on Sentinel), and the package files (tsc runs, the
 *    consumer apps' own test runners) are CPU-bound: niced, they take mostly the CPU the timing files
 *    leave, and the kernel gives it back to them when they wake. The timing files are judged
 *    beside 4 CPU-bound processes at normal priority anyway (CONTRIBUTING.md, Durations). Once `timing`
 *    is done, the package project's processes get the normal priority back (where the user may raise
 *    a priority: root, or a RLIMIT_NICE that allows it); beside other CPU-bound work a niced project
 *    gets a few percent of the CPU, and its steps' limits are made for catching a hang, not for that.
 *    The package project's output is held and printed after the timing project's, so neither report is
 *    interleaved.
 *
 * The exit code is 1 when any project failed, after all of them ran.
 */
import { spawn } from 'node:child_process';
import { mkdtempSync, openSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { renice } from './priority.mjs';

const npm = process.platform === 'win32' ? 'npm.cmd' : 'npm';
/**
 * The package project's niceness beside the timing project: 10 gives a timing file about ten times its
 * CPU when both want it. Not 19: beside other CPU-bound work at normal priority (4 such processes in the
 * load test of CONTRIBUTING.md) a nice-19 project gets under 1 % of the CPU and its steps time out.
 */
const NICE = 10;

/** Gives the package project's processes the normal priority back (scripts/priority.mjs); says so when refused. */
function unnice(child) {
  if (process.platform === 'win32' || child?.pid === undefined || child.exitCode !== null) return;
  if (!renice(child.pid, 0)) process.stdout.write(`npm test: the package project goes on at nice ${NICE} (renice to 0 was refused)\n`);
}

/** Runs `npm run <script>` and resolves with its exit code; output to this terminal, or to `out` (a fd). */
function run(script, { out, nice = false, started } = {}) {
  const stdio = out === undefined ? 'inherit' : ['ignore', out, out];
  const [command, args] =
    nice && process.platform !== 'win32' ? ['nice', ['-n', String(NICE), npm, 'run', script]] : [npm, ['run', script]];
  return new Promise((resolve) => {
    const child = spawn(command, args, { stdio });
    started?.(child);
    child.on('error', (error) => {
      process.stderr.write(`npm test: could not run ${script}: ${error.message}\n`);
      resolve(1);
    });
    child.on('close', (code, signal) => resolve(code ?? (signal ? 1 : 0)));
  });
}

const checked = await run('check');
if (checked !== 0) process.exit(checked);

const fast = await run('test:fast');

const dir = mkdtempSync(join(tmpdir(), 'rl-npm-test-'));
const logPath = join(dir, 'package.log');
let packageChild;
const packaged = run('test:package', { out: openSync(logPath, 'w'), nice: true, started: (child) => (packageChild = child) });
const timing = await run('test:timing');
unnice(packageChild);
process.stdout.write(`\n--- test:package (ran beside test:timing at nice ${NICE}) ---\n`);
const packageCode = await packaged;
process.stdout.write(readFileSync(logPath, 'utf8'));
rmSync(dir, { recursive: true, force: true });

process.exit(fast !== 0 || timing !== 0 || packageCode !== 0 ? 1 : 0);
