/** Unit specs beside the library code, e2e specs in test/<scenario>/; all against a real Redis. */
export default {
  testEnvironment: 'node',
  rootDir: '.',
  extensionsToTreatAsEsm: ['.ts'],
  moduleNameMapper: {
    '^nest-redis-rate-limit$': '<rootDir>/libs/rate-limit/src/index.ts',
    '^(\\.{1,2}/.*)\\.js$': '$1',
  },
  transform: {
    '^.+\\.ts$': ['ts-jest', { useESM: true, tsconfig: '<rootDir>/tsconfig.json' }],
  },
  testMatch: ['<rootDir>/libs/**/*.spec.ts', '<rootDir>/test/**/*.e2e-spec.ts'],
  testTimeout: 30_000,
  maxWorkers: 2,
};
