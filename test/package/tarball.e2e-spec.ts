import { readdir, readFile } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { FIXTURES, packTarball, ROOT, run, runOk, SETUP_TIMEOUT, STEP_TIMEOUT } from './support/consumer.js';
import { LUA_SCRIPTS } from '../../libs/rate-limit/src/stores/redis/lua/lua-scripts.js';

/** What `npm pack --workspace libs/rate-limit` puts in the tarball, and the contract in its package.json. */

/** The ranges the consumer apps in test/package/fixtures prove (lowest pinned version of each major). */
const PROVEN_PEERS = {
  '@nestjs/common': '^11.0.1 || ^12.0.1',
  '@nestjs/core': '^11.0.1 || ^12.0.1',
  ioredis: '^5.8.0 || ^6.0.0',
  'reflect-metadata': '^0.2.0',
  rxjs: '^7.1.0',
};

/** Peers only `verifyBucketStore` of `nest-redis-rate-limit/testing` loads, when called: a user who never calls it needs none of them. */
const OPTIONAL_PEERS = { 'fast-check': '^4.0.0' };

/** The only runtime dependency: OpenTelemetry's API, which has no dependencies of its own. */
const RUNTIME_DEPENDENCIES = { '@opentelemetry/api': '^1.3.0' };

describe('the packed tarball', () => {
  let tarball: string;
  let files: string[];

  beforeAll(async () => {
    tarball = await packTarball();
    files = (await runOk('tar', ['-tzf', tarball], ROOT)).stdout.split('\n').filter(Boolean).sort();
  }, SETUP_TIMEOUT);

  const extract = async (file: string) => (await runOk('tar', ['-xzOf', tarball, `package/${file}`], ROOT)).stdout;

  it(
    'holds one CommonJS build (dist/cjs), an ESM entry that re-exports it (dist/esm), README.md, LICENSE and package.json, and no sources, specs or build info',
    () => {
      expect(files.filter((file) => !file.startsWith('package/dist/cjs/'))).toEqual([
        'package/LICENSE',
        'package/README.md',
        'package/dist/esm/index.d.ts',
        'package/dist/esm/index.js',
        'package/dist/esm/testing/index.d.ts',
        'package/dist/esm/testing/index.js',
        'package/package.json',
      ]);
      expect(files).toContain('package/dist/cjs/package.json');
      expect(files).toContain('package/dist/cjs/index.js');
      expect(files).toContain('package/dist/cjs/index.d.ts');
      expect(files.filter((file) => /\.spec\.|tsbuildinfo|\.ts$/.test(file) && !file.endsWith('.d.ts'))).toEqual([]);
      const modules = files.filter((file) => file.endsWith('.js'));
      expect(modules.length).toBeGreaterThan(20);
      for (const module of modules) expect(files).toContain(module.replace(/\.js$/, '.d.ts'));
    },
    STEP_TIMEOUT,
  );

  it(
    'marks dist/cjs as CommonJS and makes dist/esm/index.js import it and re-export every name it exports',
    async () => {
      expect(JSON.parse(await extract('dist/cjs/package.json'))).toEqual({ type: 'commonjs' });
      const cjs = await extract('dist/cjs/index.js');
      expect(cjs).toMatch(/^"use strict";/);
      expect(cjs).not.toMatch(/^export /m);
      const names = [...cjs.matchAll(/^Object\.defineProperty\(exports, "(\w+)"/gm)]
        .map((m) => m[1]!)
        .filter((name) => name !== '__esModule')
        .sort();
      expect(names).toContain('RateLimitException');
      const esm = await extract('dist/esm/index.js');
      expect(esm).toMatch(/^import build from '\.\.\/cjs\/index\.js';$/m);
      const exported = /export const \{([^}]*)\} = build;/
        .exec(esm)?.[1]
        ?.split(',')
        .map((name) => name.trim())
        .filter(Boolean);
      expect(exported).toEqual(names);
      expect(await extract('dist/esm/index.d.ts')).toMatch(/^export \* from '\.\.\/cjs\/index\.js';$/m);
      // The testing subpath the same way: one implementation, its names re-exported.
      const testing = await extract('dist/esm/testing/index.js');
      expect(testing).toMatch(/^import build from '\.\.\/\.\.\/cjs\/testing\/index\.js';$/m);
      expect(
        /export const \{([^}]*)\} = build;/
          .exec(testing)?.[1]
          ?.split(',')
          .map((name) => name.trim())
          .filter(Boolean),
      ).toEqual(['createRedisTestPrefix', 'verifyBucketStore']);
    },
    STEP_TIMEOUT,
  );

  it(
    'has types that resolve for require() and import under node10, node16 and bundler resolution (@arethetypeswrong/cli finds no problem)',
    async () => {
      const attw = join(dirname(createRequire(import.meta.url).resolve('@arethetypeswrong/cli/package.json')), 'dist/index.js');
      const checked = await run(process.execPath, [attw, tarball, '--no-color'], ROOT);
      const output = checked.stdout + checked.stderr;
      expect([checked.code, /No problems found/.test(output) ? 'no problems' : output]).toEqual([0, 'no problems']);
    },
    STEP_TIMEOUT,
  );

  it(
    'carries each Redis script as code in the build (no .lua file is read at run time), the same text as the sources assemble',
    async () => {
      expect(files.filter((file) => file.endsWith('.lua'))).toEqual([]);
      const built = await extract('dist/cjs/stores/redis/lua/lua-sources.generated.js');
      for (const script of LUA_SCRIPTS) expect(built).toContain(JSON.stringify(script.lua));
    },
    STEP_TIMEOUT,
  );

  it(
    "ships the repository's README and the MIT license",
    async () => {
      expect(await extract('README.md')).toBe(await readFile(join(ROOT, 'README.md'), 'utf8'));
      expect(await extract('LICENSE')).toMatch(/^MIT License\n/);
    },
    STEP_TIMEOUT,
  );

  it(
    'declares a public package with require and import conditions, each with its types; one runtime dependency (the OpenTelemetry API), the proven peer ranges, fast-check an optional peer (the testing subpath)',
    async () => {
      const manifest = JSON.parse(await extract('package.json')) as Record<string, unknown>;
      expect(manifest).toMatchObject({
        name: 'nest-redis-rate-limit',
        license: 'MIT',
        type: 'module',
        main: './dist/cjs/index.js',
        types: './dist/cjs/index.d.ts',
        sideEffects: false,
        engines: { node: '^20.19.0 || >=22.12.0' },
        exports: {
          '.': {
            import: { types: './dist/esm/index.d.ts', default: './dist/esm/index.js' },
            require: { types: './dist/cjs/index.d.ts', default: './dist/cjs/index.js' },
          },
          './testing': {
            import: { types: './dist/esm/testing/index.d.ts', default: './dist/esm/testing/index.js' },
            require: { types: './dist/cjs/testing/index.d.ts', default: './dist/cjs/testing/index.js' },
          },
          './package.json': './package.json',
        },
        // For node10 resolution (TypeScript's `moduleResolution: node`), which does not read `exports`.
        typesVersions: { '*': { testing: ['./dist/cjs/testing/index.d.ts'] } },
      });
      expect(manifest.private).toBeUndefined();
      // The metrics API (a no-op without an SDK), with a low caret floor so that it dedupes onto an app's own copy.
      expect(manifest.dependencies).toEqual(RUNTIME_DEPENDENCIES);
      expect(manifest.peerDependencies).toEqual({ ...PROVEN_PEERS, ...OPTIONAL_PEERS });
      expect(manifest.peerDependenciesMeta).toEqual({ 'fast-check': { optional: true } });
    },
    STEP_TIMEOUT,
  );

  it(
    'starts every peer range, per major version, at a version a consumer fixture pins, and admits every pin',
    async () => {
      const pins = new Map<string, Set<string>>();
      for (const fixture of await readdir(FIXTURES)) {
        const manifest = JSON.parse(await readFile(join(FIXTURES, fixture, 'package.json'), 'utf8')) as {
          dependencies: Record<string, string>;
        };
        for (const [name, version] of Object.entries(manifest.dependencies)) {
          if (name in PROVEN_PEERS) pins.set(name, (pins.get(name) ?? new Set()).add(version));
        }
      }
      const parse = (version: string) => version.split('.').map(Number) as [number, number, number];
      const atLeast = (a: number[], b: number[]) =>
        a[0]! > b[0]! || (a[0] === b[0] && (a[1]! > b[1]! || (a[1] === b[1] && a[2]! >= b[2]!)));
      for (const [name, range] of Object.entries(PROVEN_PEERS)) {
        const floors = range.split(' || ').map((part) => parse(part.replace(/^\^/, '')));
        const pinned = [...(pins.get(name) ?? [])].map(parse);
        // Caret ranges below 1.0 pin the minor too (^0.2.0 is >=0.2.0 <0.3.0).
        const sameLine = (floor: number[], version: number[]) => floor[0] === version[0] && (floor[0] !== 0 || floor[1] === version[1]);
        for (const floor of floors) {
          const line = pinned.filter((version) => sameLine(floor, version));
          const lowest = line.sort((a, b) => (atLeast(a, b) ? 1 : -1))[0];
          expect([name, lowest?.join('.')]).toEqual([name, floor.join('.')]);
        }
        for (const version of pinned) {
          expect([name, version.join('.'), floors.some((floor) => sameLine(floor, version) && atLeast(version, floor))]).toEqual([
            name,
            version.join('.'),
            true,
          ]);
        }
      }
    },
    STEP_TIMEOUT,
  );
});
