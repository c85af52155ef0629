/**
 * Unit specs beside the library code, e2e specs in test/<scenario>/; all against a real Redis.
 *
 * Two projects, which `npm test` runs one after the other:
 * - `timing`: the files whose assertions depend on wall-clock time (a wait bounded by timeoutMs,
 *   allowed ≤ B + R·T, Retry-After after a measured span, retries within a sleep...). Run alone and
 *   in band (`jest --selectProjects timing --runInBand`), so that no other test file, tsc build or
 *   worker app shares the CPU with them.
 * - `fast`: everything else, in parallel.
 * A new file whose assertions depend on timing belongs in TIMING below.
 *
 * globalSetup finds (or starts) one Redis for the whole run and exports REDIS_URL; globalTeardown
 * stops it and kills every process group a test left running (test/support/test-run.ts).
 */
const TIMING = [
  'test/failure-modes/',
  'test/clock-skew/',
  'test/multi-process/',
  'test/deny-cache/',
  'test/gateway/',
  'test/api-keys/',
  'test/http-headers/',
  'test/penalties/',
  'test/per-request/resolver-deadline.e2e-spec.ts',
  'test/cluster/cluster-breaker.e2e-spec.ts',
  'test/redis-connection/connection-errors.e2e-spec.ts',
  'test/redis-connection/startup-check.e2e-spec.ts',
  'test/redis-connection/failover-and-shutdown.e2e-spec.ts',
  'libs/rate-limit/src/engine/with-timeout.spec.ts',
  'test/redis/sentinel-failover.timing.e2e-spec.ts',
];
/** The consumer apps' own e2e specs: their own runners run them against the installed package (test/package). */
const FIXTURES = '<rootDir>/test/package/fixtures/';
const escape = (path) => path.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');

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
  testMatch: ['<rootDir>/libs/**/*.spec.ts', '<rootDir>/test/**/*.e2e-spec.ts'],
  testTimeout: 30_000,
  globalSetup: '<rootDir>/test/support/global-setup.mjs',
  globalTeardown: '<rootDir>/test/support/global-teardown.mjs',
};

export default {
  globalSetup: common.globalSetup,
  globalTeardown: common.globalTeardown,
  testTimeout: common.testTimeout,
  maxWorkers: 2,
  projects: [
    {
      ...common,
      displayName: 'fast',
      testPathIgnorePatterns: ['/node_modules/', FIXTURES, ...TIMING.map((p) => `<rootDir>/${escape(p)}`)],
    },
    {
      ...common,
      displayName: 'timing',
      testMatch: TIMING.map((p) => (p.endsWith('/') ? `<rootDir>/${p}**/*.e2e-spec.ts` : `<rootDir>/${p}`)),
    },
  ],
};
