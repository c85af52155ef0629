import { readdirSync } from 'node:fs';
import { basename, dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';

/**
 * The layout CONTRIBUTING.md describes (Layout): every test is under test/<area>/<topic>/ and none is in
 * libs/, whose folder holds only the code that ships; and no two files of libs/rate-limit/src share a
 * name, so that a name says which file it is (issue 34, item 4). The one exception is `index.ts`, the
 * two package entry points: `nest-redis-rate-limit` and `nest-redis-rate-limit/testing`.
 */
const ROOT = join(dirname(fileURLToPath(import.meta.url)), '../..');
const LIBS = join(ROOT, 'libs');
const SRC = join(LIBS, 'rate-limit/src');
const ENTRY_POINTS = ['index.ts', 'testing/index.ts'];

/** A test file by its name, whatever the runner: `x.spec.ts`, `x.e2e-spec.ts`, `x.test.mjs`... */
const TEST_FILE = /[.-](spec|test)\.[cm]?[jt]sx?$/;

/** The files under `dir`, relative to it; node_modules and build output left out. */
function filesUnder(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true, recursive: true })
    .filter((entry) => entry.isFile())
    .map((entry) => relative(dir, join(entry.parentPath, entry.name)))
    .filter((file) => !file.split('/').some((part) => part === 'node_modules' || part === 'dist'));
}

/** The names that more than one of `files` has, each with its files; but the entry points, which share `index.ts`. */
function sameNamed(files: readonly string[]): Record<string, string[]> {
  const byName = new Map<string, string[]>();
  for (const file of files) byName.set(basename(file), [...(byName.get(basename(file)) ?? []), file]);
  return Object.fromEntries([...byName].filter(([, paths]) => paths.length > 1 && !paths.every((path) => ENTRY_POINTS.includes(path))));
}

describe('the layout of the repository', () => {
  it('finds test files and same-named files where they are (the checks below can fail)', () => {
    const made = ['a/identity.ts', 'b/identity.ts', 'index.ts', 'testing/index.ts', 'a/x.spec.ts', 'b/y.e2e-spec.ts', 'c/z.test.mjs'];
    expect(made.filter((file) => TEST_FILE.test(file))).toEqual(['a/x.spec.ts', 'b/y.e2e-spec.ts', 'c/z.test.mjs']);
    expect(sameNamed(made)).toEqual({ 'identity.ts': ['a/identity.ts', 'b/identity.ts'] });
    expect(sameNamed(['index.ts', 'testing/index.ts', 'other/index.ts'])).toEqual({
      'index.ts': ['index.ts', 'testing/index.ts', 'other/index.ts'],
    });
  });

  it('holds no test file in libs/: every test is under test/<area>/<topic>/', () => {
    const library = filesUnder(LIBS);
    expect(library).toContain('rate-limit/src/index.ts');
    expect(library.filter((file) => TEST_FILE.test(file))).toEqual([]);
  });

  it('gives every file of libs/rate-limit/src a name no other file there has, but the two entry points', () => {
    const sources = filesUnder(SRC);
    for (const entry of ENTRY_POINTS) expect(sources).toContain(entry);
    expect(sameNamed(sources)).toEqual({});
  });
});
