import { describeConsumer } from './support/consumer-suite.js';

/** (c) NestJS 11.0.1, CommonJS (the Nest 11 tsconfig), Express; ioredis 5.8, TypeScript 5.8, rxjs 7.1, reflect-metadata 0.2.0. */
describeConsumer({
  name: 'nest11-cjs-express',
  moduleSystem: 'commonjs',
  platform: 'express',
  nestVersion: '11.0.1',
  // `nest new`'s unchanged Jest e2e set-up (test/jest-e2e.json, ts-jest, CommonJS): 5 tests, 2 of them on Redis.
  ownTests: { runner: 'Jest', script: 'test:e2e', passed: /^Tests:\s+5 passed, 5 total$/m },
});
