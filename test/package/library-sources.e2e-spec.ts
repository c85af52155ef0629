import { createRequire } from 'node:module';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { FIXTURES, ROOT, run, STEP_TIMEOUT } from './support/consumer.js';

/**
 * Nest monorepo users compile a library's sources with their app's tsconfig (`nest g library` maps the
 * library's src into the app). The library's own sources (the folder holds no tests: they are all under test/) must type-check under the
 * compiler options of the strict ESM fixture and of Nest's default non-strict one (strictNullChecks and
 * noImplicitAny off), with skipLibCheck off as both fixtures have it.
 */

const TSC = createRequire(import.meta.url).resolve('typescript/bin/tsc');
const SOURCES = join(ROOT, 'libs/rate-limit/src');

// The two checks run at once (it.concurrent): each is one CPU-bound tsc, and the package project runs
// beside the timing project, whose files mostly wait.
describe('libs/rate-limit/src under the tsconfig of a consumer app', () => {
  it.concurrent.each([
    ['nest12-esm-express', 'strict, noImplicitOverride, noImplicitReturns'],
    ['nest12-cjs-fastify', "Nest's default: strict off, so strictNullChecks and noImplicitAny off"],
  ])(
    '%s (%s): type-checks without an error',
    async (fixture) => {
      const dir = await mkdtemp(join(tmpdir(), `nrrl-sources-${fixture}-`));
      try {
        const tsconfig = {
          extends: join(FIXTURES, fixture, 'tsconfig.json'),
          compilerOptions: {
            noEmit: true,
            incremental: false,
            rootDir: SOURCES,
            typeRoots: [join(ROOT, 'node_modules/@types')],
          },
          include: [join(SOURCES, '**/*.ts')],
        };
        await writeFile(join(dir, 'tsconfig.json'), JSON.stringify(tsconfig, null, 2));
        const checked = await run(process.execPath, [TSC, '-p', join(dir, 'tsconfig.json'), '--listFiles'], ROOT);
        const lines = (checked.stdout + checked.stderr).split('\n').filter(Boolean);
        const sources = lines.filter((line) => line.startsWith(SOURCES));
        expect(sources).toContain(join(SOURCES, 'decorators/rate-limit.decorator.ts'));
        expect(sources.filter((file) => file.endsWith('.spec.ts'))).toEqual([]);
        expect(lines.filter((line) => !line.startsWith('/'))).toEqual([]);
        expect(checked.code).toBe(0);
      } finally {
        await rm(dir, { recursive: true, force: true });
      }
    },
    STEP_TIMEOUT,
  );
});
