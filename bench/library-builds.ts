import { execFileSync, spawnSync } from 'node:child_process';
import { cpSync, existsSync, mkdirSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { HERE } from './processes.js';

/**
 * Other builds of the library than this tree's, for the steps that measure one beside ours or instead
 * of it: bench/compare-instructions.ts (a commit against another, by callgrind), the instructions step
 * (BENCH_LIBRARY_DIR) and the decisions step (BENCH_BASELINE).
 *
 * - `preparePackage`: a built package directory for a side given as `.`, a commit or branch (built in
 *   .bench-tmp/trees/<sha>/), or a directory that holds one.
 * - `benchBeside`: a copy of this bench's compiled files beside a copy of such a package, so that the
 *   bench's processes started from the copy load that package, and the package resolves @nestjs/*,
 *   ioredis, ... from this tree's node_modules (one Nest for the bench and the library).
 */

export const ROOT = resolve(HERE, '../..');
/** What a commit's build needs, taken with git archive (BENCH_COMPARE_FILES, space-separated), and where the package is. */
const FILES = (process.env.BENCH_COMPARE_FILES ?? 'libs/rate-limit tsconfig.json').split(' ').filter(Boolean);
const LIBRARY = process.env.BENCH_COMPARE_LIBRARY ?? 'libs/rate-limit';

export function git(...args: string[]): string {
  return execFileSync('git', args, { cwd: ROOT, encoding: 'utf8' }).trim();
}

/** A built package: its directory, and a label for file names (a short sha for a commit). */
export interface PreparedPackage {
  dir: string;
  label: string;
}

/**
 * A built package directory for `side`: `.` (this tree's libs/rate-limit as bench:build built it), a
 * directory holding a built package (package.json + dist/), or a git commit or branch, whose
 * libs/rate-limit and root tsconfig.json (BENCH_COMPARE_FILES) are taken with `git archive` into
 * .bench-tmp/trees/<sha>/ and built there with its own `npm run build`.
 */
export function preparePackage(side: string): PreparedPackage {
  if (side === '.') return { dir: join(ROOT, 'libs', 'rate-limit'), label: `${git('rev-parse', '--short', 'HEAD')}-tree` };
  if (existsSync(join(side, 'package.json'))) return { dir: resolve(side), label: side.replace(/[^\w.-]+/g, '_') };
  const sha = git('rev-parse', '--short', `${side}^{commit}`);
  const tree = join(ROOT, '.bench-tmp', 'trees', sha);
  rmSync(tree, { recursive: true, force: true });
  mkdirSync(tree, { recursive: true });
  // Only the library and the tsconfig it extends; its build resolves node_modules from this tree.
  const archive = execFileSync('git', ['archive', sha, ...FILES], { cwd: ROOT, maxBuffer: 1 << 28 });
  execFileSync('tar', ['-x', '-C', tree], { input: archive });
  const library = join(tree, LIBRARY);
  console.log(`building ${side} (${sha}) in ${library}`);
  const built = spawnSync('npm', ['run', 'build'], { cwd: library, stdio: 'inherit' });
  if (built.status !== 0) throw new Error(`build of ${side} failed`);
  return { dir: library, label: sha };
}

/**
 * Copies the built package `packageDir` to `<base>/node_modules/nest-redis-rate-limit` and this bench's
 * compiled files to `<base>/bench` (`base` is emptied first); answers the copy's bench directory, from
 * which bench processes load that package.
 */
export function benchBeside(packageDir: string, base: string): string {
  const source = resolve(packageDir);
  if (!existsSync(join(source, 'package.json')) || !existsSync(join(source, 'dist'))) {
    throw new Error(`${packageDir}: expected a built package (package.json and dist/); run its build first`);
  }
  rmSync(base, { recursive: true, force: true });
  const target = join(base, 'node_modules', 'nest-redis-rate-limit');
  mkdirSync(target, { recursive: true });
  cpSync(join(source, 'package.json'), join(target, 'package.json'));
  // dereference: a copy, never a link (Node would resolve a link's dependencies from where it points).
  cpSync(join(source, 'dist'), join(target, 'dist'), { recursive: true, dereference: true });
  const dir = join(base, 'bench');
  mkdirSync(dir, { recursive: true });
  for (const file of readdirSync(HERE)) if (file.endsWith('.js')) cpSync(join(HERE, file), join(dir, file));
  // The bench's package scope: ESM, as in the tree.
  writeFileSync(join(base, 'package.json'), '{ "type": "module", "private": true }\n');
  return dir;
}
