import { type ChildProcess, spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { cp, mkdir, mkdtemp, readdir, readFile, rename, rm, stat, writeFile } from 'node:fs/promises';
import { request } from 'node:http';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';

/**
 * The package as a user gets it: `npm pack` of libs/rate-limit, installed with npm into throwaway apps
 * outside the workspace (test/package/fixtures/<name>: their own package.json and lockfile), compiled
 * with their own tsconfig and started as processes of their own.
 *
 * Caches, under os.tmpdir()/nest-redis-rate-limit-tests/: the tarball, by a hash of everything that
 * goes into it (so test files and reruns pack once), and each fixture's `npm ci`, by a hash of its
 * package.json and lockfile. Every test copies the cached install into a directory of its own and
 * installs the tarball there, so parallel test files and parallel runs never share a node_modules.
 */

/**
 * A step of the package tests or a consumer app (a tsc run, its own test runner, a start) takes seconds on a
 * quiet machine and minutes beside CPU-bound work: `npm test` runs this project at nice 10 while the timing
 * project runs (about 6 minutes beside 4 CPU-bound processes), and a type-check of the library's sources
 * started then outlasted 5 minutes. The limit only catches a hang, never a slow machine.
 */
export const STEP_TIMEOUT = 10 * 60_000;

/**
 * The first run installs each fixture from the registry and packs the library (a build) before its steps:
 * at nice 10 beside the timing project and 4 CPU-bound processes, a first pack took over 5 minutes.
 */
export const SETUP_TIMEOUT = 15 * 60_000;

export const ROOT = fileURLToPath(new URL('../../../', import.meta.url));
export const FIXTURES = join(ROOT, 'test/package/fixtures');
const LIBRARY = join(ROOT, 'libs/rate-limit');
const CACHE = join(tmpdir(), 'nest-redis-rate-limit-tests');

/**
 * What `npm test` puts in the environment about this workspace (its prefix, package, script, workspace
 * flags): an npm started in a fixture must not inherit it. Settings such as the registry or the cache stay.
 */
const WORKSPACE_NPM_VARIABLES =
  /^npm_(package_|lifecycle_|command$|config_(local_prefix|prefix|global_prefix|workspaces?|include_workspace_root)$)/i;

/** The environment for npm and the apps: no workspace settings of the parent npm, no jest flags. */
function childEnv(extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [name, value] of Object.entries(process.env)) {
    if (!WORKSPACE_NPM_VARIABLES.test(name) && name !== 'NODE_OPTIONS' && name !== 'INIT_CWD') env[name] = value;
  }
  return { ...env, ...extra };
}

export interface RunResult {
  code: number | null;
  stdout: string;
  stderr: string;
}

/**
 * Runs a command to completion (any exit code); `npm` is npm's own CLI. Commands run at the project's
 * own priority: `npm test` runs it at nice 10 beside the timing project, and at the normal one after.
 */
export function run(command: string, args: string[], cwd: string, env: Record<string, string> = {}): Promise<RunResult> {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, { cwd, env: childEnv(env), stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (chunk: Buffer) => (stdout += chunk.toString()));
    child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, stdout, stderr }));
  });
}

/** Like `run`, but rejects with the command's output unless it exits with 0. */
export async function runOk(command: string, args: string[], cwd: string): Promise<RunResult> {
  const result = await run(command, args, cwd);
  if (result.code !== 0) {
    throw new Error(`${command} ${args.join(' ')} (in ${cwd}) exited with ${result.code}:\n${result.stdout}\n${result.stderr}`);
  }
  return result;
}

function sha256(parts: Array<string | Buffer>): string {
  const hash = createHash('sha256');
  for (const part of parts) hash.update(part).update('\0');
  return hash.digest('hex').slice(0, 16);
}

async function filesUnder(dir: string): Promise<string[]> {
  const entries = await readdir(dir, { withFileTypes: true, recursive: true });
  return entries
    .filter((entry) => entry.isFile())
    .map((entry) => join(entry.parentPath, entry.name))
    .sort();
}

async function exists(path: string): Promise<boolean> {
  return stat(path).then(
    () => true,
    () => false,
  );
}

/**
 * Holds a lock directory while `work` runs. `npm pack` rebuilds libs/rate-limit/dist, so two packs of
 * this working tree must not overlap, whichever test file or run asks. The lock holds its owner's pid: a
 * lock whose owner is gone was left by a killed run and is taken over. A pack takes seconds on a quiet
 * machine but minutes on a loaded one, so the lock's age says nothing; only a lock without a pid (its
 * owner killed between the two writes) goes by age, after 2 minutes.
 */
async function withLock<T>(lock: string, work: () => Promise<T>): Promise<T> {
  const deadline = Date.now() + SETUP_TIMEOUT;
  for (;;) {
    try {
      await mkdir(lock);
      await writeFile(join(lock, 'pid'), String(process.pid));
      break;
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== 'EEXIST') throw error;
      if (await abandoned(lock)) await rm(lock, { recursive: true, force: true });
      if (Date.now() > deadline) throw new Error(`Waited ${SETUP_TIMEOUT / 60_000} minutes for ${lock}`);
      await new Promise((resolve) => setTimeout(resolve, 250));
    }
  }
  try {
    return await work();
  } finally {
    await rm(lock, { recursive: true, force: true });
  }
}

/**
 * A lock whose owner process is gone, or without a pid older than 2 minutes, or older than 30 (its pid
 * reused by another process: no pack takes that long).
 */
async function abandoned(lock: string): Promise<boolean> {
  const age = await stat(lock).then(
    (s) => Date.now() - s.mtimeMs,
    () => 0,
  );
  const pid = Number(await readFile(join(lock, 'pid'), 'utf8').catch(() => ''));
  if (!(pid > 0)) return age > 2 * 60_000;
  try {
    process.kill(pid, 0);
    return age > 30 * 60_000;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'ESRCH';
  }
}

/** Every change to the library packs anew: tarballs no run has packed for a day are dropped. */
async function pruneTarballs(keep: string): Promise<void> {
  for (const entry of await readdir(CACHE)) {
    const dir = join(CACHE, entry);
    if (!entry.startsWith('tarball-') || dir === keep) continue;
    const age = await stat(dir).then(
      (s) => Date.now() - s.mtimeMs,
      () => 0,
    );
    if (age > 24 * 3600_000) await rm(dir, { recursive: true, force: true });
  }
}

let tarballPromise: Promise<string> | undefined;

/**
 * The tarball of `npm pack --workspace libs/rate-limit` (prepack builds dist and adds the README), packed
 * once per content: the hash covers the library's sources, package.json, LICENSE, tsconfigs, build script and README.
 */
export function packTarball(): Promise<string> {
  tarballPromise ??= (async () => {
    const inputs = [
      ...(await filesUnder(join(LIBRARY, 'src'))),
      join(LIBRARY, 'package.json'),
      join(LIBRARY, 'LICENSE'),
      join(LIBRARY, 'tsconfig.lib.json'),
      join(LIBRARY, 'scripts/esm-entry.mjs'),
      join(ROOT, 'tsconfig.json'),
      join(ROOT, 'README.md'),
    ];
    const parts: Array<string | Buffer> = [];
    for (const file of inputs) parts.push(relative(ROOT, file), await readFile(file));
    const key = sha256(parts);
    const dir = join(CACHE, `tarball-${key}`);
    const tarball = join(dir, 'nest-redis-rate-limit.tgz');
    if (await exists(tarball)) return tarball;
    await mkdir(CACHE, { recursive: true });
    const lock = join(CACHE, `pack-${sha256([ROOT])}.lock`);
    return withLock(lock, async () => {
      if (await exists(tarball)) return tarball;
      const staging = await mkdtemp(join(CACHE, 'pack-'));
      try {
        await runOk('npm', ['pack', '--workspace', 'libs/rate-limit', '--pack-destination', staging], ROOT);
        const packed = (await readdir(staging)).filter((name) => name.endsWith('.tgz'));
        if (packed.length !== 1) throw new Error(`npm pack wrote ${packed.join(', ') || 'nothing'} to ${staging}`);
        await mkdir(dir, { recursive: true });
        await rename(join(staging, packed[0]!), tarball);
        await pruneTarballs(dir);
        return tarball;
      } finally {
        await rm(staging, { recursive: true, force: true });
      }
    });
  })();
  return tarballPromise;
}

/**
 * `npm ci` of a fixture's lockfile, done once per lockfile (hash of package.json and package-lock.json)
 * and kept under os.tmpdir(). Installed into a fresh directory and renamed into place when complete,
 * so a killed run or a parallel one never leaves a half-installed cache behind.
 */
async function cachedInstall(fixture: string): Promise<string> {
  const source = join(FIXTURES, fixture);
  const manifest = await readFile(join(source, 'package.json'));
  const lockfile = await readFile(join(source, 'package-lock.json'));
  const dir = join(CACHE, `ci-${fixture}-${sha256([manifest, lockfile])}`);
  if (await exists(join(dir, 'node_modules'))) return dir;
  await mkdir(CACHE, { recursive: true });
  const staging = await mkdtemp(join(CACHE, `ci-${fixture}-tmp-`));
  try {
    await writeFile(join(staging, 'package.json'), manifest);
    await writeFile(join(staging, 'package-lock.json'), lockfile);
    await runOk('npm', ['ci', '--ignore-scripts', '--no-audit', '--no-fund'], staging);
    await rename(staging, dir).catch(async (error: NodeJS.ErrnoException) => {
      // Another run finished the same install first: keep theirs.
      if (error.code !== 'ENOTEMPTY' && error.code !== 'EEXIST') throw error;
      await rm(staging, { recursive: true, force: true });
    });
    return dir;
  } catch (error) {
    await rm(staging, { recursive: true, force: true });
    throw error;
  }
}

/**
 * Copies a cached install. Hard links where the platform allows (`cp -al`: a second instead of several),
 * minus the three files npm rewrites in place, so the cache never changes: the copy's npm install only
 * adds a directory for the package and writes those files anew.
 */
async function copyInstall(from: string, to: string): Promise<void> {
  const linked = await run('cp', ['-al', `${from}/.`, to], from).catch(() => undefined);
  if (linked?.code !== 0) {
    await rm(to, { recursive: true, force: true });
    await mkdir(to);
    await cp(from, to, { recursive: true, verbatimSymlinks: true });
    return;
  }
  for (const file of ['package.json', 'package-lock.json', 'node_modules/.package-lock.json']) {
    const content = await readFile(join(from, file));
    await rm(join(to, file));
    await writeFile(join(to, file), content);
  }
}

export interface ConsumerApp {
  /** The app's directory, outside the workspace. */
  dir: string;
  /** What `npm install <tarball>` printed (its warnings included). */
  installOutput: string;
  /** Compiles the app with its own tsconfig (`tsc -p tsconfig.json`). */
  compile(): Promise<RunResult>;
  remove(): Promise<void>;
}

/** A copy of a fixture with its locked dependencies, and the packed tarball installed by npm. */
export async function installConsumer(fixture: string, tarball: string): Promise<ConsumerApp> {
  const installed = await cachedInstall(fixture);
  const dir = await mkdtemp(join(tmpdir(), `nrrl-${fixture}-`));
  await copyInstall(installed, dir);
  const source = join(FIXTURES, fixture);
  for (const entry of await readdir(source)) {
    if (entry !== 'node_modules' && entry !== 'dist') await cp(join(source, entry), join(dir, entry), { recursive: true });
  }
  // A plain `npm install` of the file: npm resolves its peerDependencies against the app's locked
  // packages and fails (ERESOLVE) when a range does not admit them.
  const install = await runOk(
    'npm',
    ['install', '--no-save', '--ignore-scripts', '--no-audit', '--no-fund', '--prefer-offline', tarball],
    dir,
  );
  return {
    dir,
    installOutput: install.stdout + install.stderr,
    compile: () => run(process.execPath, [join(dir, 'node_modules/typescript/bin/tsc'), '-p', 'tsconfig.json'], dir),
    remove: () => rm(dir, { recursive: true, force: true }),
  };
}

export interface RunningApp {
  url: string;
  /** Everything the process wrote to stderr so far. */
  stderr(): string;
  /** SIGTERM (the app's shutdown hooks run), SIGKILL after 5 s; resolves with the exit code or signal. */
  stop(): Promise<number | string | null>;
}

/** Starts `node dist/main.js` in the app's directory and resolves when it prints its URL. */
export function startConsumer(dir: string, env: Record<string, string>): Promise<RunningApp> {
  return new Promise((resolve, reject) => {
    const child: ChildProcess = spawn(process.execPath, ['dist/main.js'], {
      cwd: dir,
      env: childEnv(env),
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    const exited = new Promise<number | string | null>((done) => child.once('exit', (code, signal) => done(code ?? signal)));
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`The app in ${dir} did not start within 5 minutes:\n${stdout}\n${stderr}`));
      // A start takes a second or two; at nice 10 beside CPU-bound work many times that: only a hang is caught.
    }, STEP_TIMEOUT / 2);
    child.once('exit', (code, signal) => {
      clearTimeout(timer);
      reject(new Error(`The app in ${dir} exited (${code ?? signal}) before listening:\n${stdout}\n${stderr}`));
    });
    child.stderr!.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
    child.stdout!.on('data', (chunk: Buffer) => {
      stdout += chunk.toString();
      const match = /listening on (http:\/\/\S+)/.exec(stdout);
      if (!match) return;
      clearTimeout(timer);
      resolve({
        url: match[1]!.replace('[::1]', '127.0.0.1'),
        stderr: () => stderr,
        stop: async () => {
          if (child.exitCode === null && child.signalCode === null) {
            child.kill('SIGTERM');
            const killer = setTimeout(() => child.kill('SIGKILL'), 5_000);
            const result = await exited;
            clearTimeout(killer);
            return result;
          }
          return exited;
        },
      });
    });
  });
}

export interface HttpResponse {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: string;
}

/** One HTTP request on a connection of its own (nothing left open after the test). */
export function http(method: string, url: string): Promise<HttpResponse> {
  return new Promise((resolve, reject) => {
    const req = request(url, { method, agent: false, headers: { connection: 'close' } }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (chunk: string) => (body += chunk));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body }));
    });
    req.on('error', reject);
    req.end();
  });
}

/** A header as a number (node lower-cases header names). */
export function numberHeader(response: HttpResponse, name: string): number {
  const value = response.headers[name.toLowerCase()];
  if (typeof value !== 'string') throw new Error(`No ${name} header in ${JSON.stringify(response.headers)}`);
  return Number(value);
}
