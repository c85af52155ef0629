import { describeConsumer } from './support/consumer-suite.js';

/** (b) NestJS 12.0.1 (the lowest 12) as `nest new` makes it: CommonJS, `strict: false`; Fastify; ioredis 6. */
describeConsumer({ name: 'nest12-cjs-fastify', moduleSystem: 'commonjs', platform: 'fastify', nestVersion: '12.0.1' });
