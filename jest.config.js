/**
 * Every test file is in test/<area>/<topic>/ (none in libs/: the library folder holds only what ships),
 * named `*.e2e-spec.ts`, against a real Redis. The areas: http, identity, policies, transports, redis,
 * properties, module, operations, docs, package, and support (the helpers).
 *
 * Three projects, chosen by file name (`npm test` is scripts/test.mjs):
 * - `fast`: everything not below, in parallel; first, with the machine to itself.
 * - `timing`: the files whose assertions depend on wall-clock time (a wait bounded by timeoutMs,
 *   allowed ≤ B + R·T, Retry-After after a measured span, retries within a sleep...), named
 *   `*.timing.e2e-spec.ts`. Two at a time (`--maxWorkers=2`): they mostly wait (on timers, a frozen
 *   Redis, Sentinel), and each is judged beside CPU-bound work anyway (CONTRIBUTING.md, Durations); no
 *   fast file shares the CPU with them.
 * - `package`: test/package/, the packed library installed into consumer apps that build and run their
 *   own test runners; the heaviest on the CPU, so last: beside `timing`, at nice 10, taking mostly the
 *   CPU the timing files leave idle.
 * A new file whose assertions depend on timing is named with the `.timing` suffix: nothing else to edit.
 *
 * globalSetup finds (or starts) one Redis for the whole run and exports REDIS_URL; globalTeardown
 * stops it and kills every process group a test left running (test/support/test-run.ts).
 */
const TIMING = ['<rootDir>/test/**/*.timing.e2e-spec.ts'];
const PACKAGE = ['<rootDir>/test/package/*.e2e-spec.ts'];
/** The consumer apps' own e2e specs: their own runners run them against the installed package (test/package). */
const FIXTURES = '<rootDir>/test/package/fixtures/';

const common = {
  testEnvironment: 'node',
  rootDir: '.',
  extensionsToTreatAsEsm: ['.ts'],
  moduleNameMapper: {
    '^nest-redis-rate-limit$': '<rootDir>/libs/rate-limit/src/index.ts',
    '^nest-redis-rate-limit/testing$': '<rootDir>/libs/rate-limit/src/testing/index.ts',
    '^(\\.{1,2}/.*)\\.js$': '$1',
  },
  transform: {
    '^.+\\.ts$': ['ts-jest', { useESM: true, tsconfig: '<rootDir>/tsconfig.json' }],
  },
  testPathIgnorePatterns: ['/node_modules/', FIXTURES],
  testTimeout: 30_000,
  globalSetup: '<rootDir>/test/support/global-setup.mjs',
  globalTeardown: '<rootDir>/test/support/global-teardown.mjs',
};

export default {
  globalSetup: common.globalSetup,
  globalTeardown: common.globalTeardown,
  testTimeout: common.testTimeout,
  maxWorkers: 2,
  // Spreads the timing project's heavy files apart (the other projects have none: their order is jest's).
  testSequencer: '<rootDir>/test/support/timing-sequencer.mjs',
  projects: [
    {
      ...common,
      displayName: 'fast',
      testMatch: ['<rootDir>/test/**/*.e2e-spec.ts'],
      testPathIgnorePatterns: [...common.testPathIgnorePatterns, '\\.timing\\.e2e-spec\\.ts$', '<rootDir>/test/package/'],
    },
    { ...common, displayName: 'timing', testMatch: TIMING },
    { ...common, displayName: 'package', testMatch: PACKAGE },
  ],
};
