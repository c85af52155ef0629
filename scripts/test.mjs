#!/usr/bin/env node
/**
 * `npm test`: the three jest projects (jest.config.js), and lint and type-check.
 *
 * 0. The programs npm does not install (chromium, luacheck): installed when missing (prerequisites.mjs).
 * 1. `fast`, with the machine to itself.
 * 2. `timing`, two files at a time (since 2026-12-05: in band it took 260 s of a quiet run, two at a time
 *    about 100 s), and, beside it, `check` (lint and type-check) and `package` at a low CPU priority
 *    (nice 10, see NICE). The timing files mostly wait (on timers, on a frozen Redis, on Sentinel), and
 *    the check (tsc, ESLint) and the package files (tsc runs, the consumer apps' own test runners) are
 *    CPU-bound: niced, they take mostly the CPU the timing files leave, and the kernel gives it back to
 *    them when they wake. The timing files are judged beside 4 CPU-bound processes at normal priority
 *    anyway (CONTRIBUTING.md, Durations). Once `timing` is done, the niced processes get the normal
 *    priority back (where the user may raise a priority: root, or a RLIMIT_NICE that allows it); beside
 *    other CPU-bound work a niced process gets a few percent of the CPU, and the package steps' limits
 *    are made for catching a hang, not for that. The niced projects' output is held and printed after
 *    the timing project's, so no report is interleaved.
 *
 * The check ran first until 2026-12-02, and stopped the run when it failed; beside `timing` it takes
 * about 25 s less of a quiet run. `npm run check` alone is the quick gate before a commit.
 *
 * The exit code is 1 when any step failed, after all of them ran.
 */
import { spawn } from 'node:child_process';
import { mkdtempSync, openSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ensurePrerequisites } from './prerequisites.mjs';
import { renice } from './priority.mjs';

const npm = process.platform === 'win32' ? 'npm.cmd' : 'npm';
/**
 * The niceness of the check and the package project beside the timing project: 10 gives a timing file
 * about ten times their CPU when both want it. Not 19: beside other CPU-bound work at normal priority
 * (4 such processes in the load test of CONTRIBUTING.md) a nice-19 project gets under 1 % of the CPU
 * and its steps time out.
 */
const NICE = 10;

/** Gives a niced step's processes the normal priority back (scripts/priority.mjs); says so when refused. */
function unnice(step, child) {
  if (process.platform === 'win32' || child?.pid === undefined || child.exitCode !== null) return;
  if (!renice(child.pid, 0)) process.stdout.write(`npm test: ${step} goes on at nice ${NICE} (renice to 0 was refused)\n`);
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

// chromium and luacheck, installed with apt-get when missing and allowed (scripts/prerequisites.mjs).
ensurePrerequisites();
const fast = await run('test:fast');

/** Runs `script` niced beside the timing project, its output held in a file until it is printed. */
function beside(script, dir) {
  const log = join(dir, `${script.replace(':', '-')}.log`);
  const step = { script, log, child: undefined };
  step.done = run(script, { out: openSync(log, 'w'), nice: true, started: (child) => (step.child = child) });
  return step;
}

const dir = mkdtempSync(join(tmpdir(), 'rl-npm-test-'));
const niced = [beside('check', dir), beside('test:package', dir)];
const timing = await run('test:timing');
for (const step of niced) unnice(step.script, step.child);
const codes = [];
for (const step of niced) {
  const code = await step.done;
  codes.push(code);
  process.stdout.write(`\n--- ${step.script} (ran beside test:timing at nice ${NICE}): ${code === 0 ? 'passed' : 'FAILED'} ---\n`);
  process.stdout.write(readFileSync(step.log, 'utf8'));
}
rmSync(dir, { recursive: true, force: true });

const failed = [['test:fast', fast], ['test:timing', timing], ...niced.map((step, i) => [step.script, codes[i]])].filter(
  ([, code]) => code !== 0,
);
if (failed.length > 0) process.stdout.write(`\nnpm test: failed: ${failed.map(([script]) => script).join(', ')}\n`);
process.exit(failed.length > 0 ? 1 : 0);
