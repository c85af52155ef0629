import { describeConsumer } from './support/consumer-suite.js';

/** (a) NestJS 12.5.1 as `nest new` 12 makes it: an ES module app (`"type": "module"`), `strict: true`, vitest; Express; ioredis 6, TypeScript 6. */
describeConsumer({
  name: 'nest12-esm-express',
  moduleSystem: 'esm',
  platform: 'express',
  nestVersion: '12.5.1',
  // A vitest e2e run, as `nest new` 12 sets it up (vitest.config.e2e.ts, globals): 5 tests, 2 of them on Redis.
  ownTests: { runner: 'Vitest', script: 'test:e2e', passed: /Tests\s+5 passed \(5\)/ },
});
