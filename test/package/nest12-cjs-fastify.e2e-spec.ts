import { describeConsumer } from './support/consumer-suite.js';

/** (b) NestJS 12.0.1 (the lowest 12) on CommonJS (`nest new` 12 makes ES modules unless asked for CommonJS), `strict: false`; Fastify; ioredis 6. */
describeConsumer({ name: 'nest12-cjs-fastify', moduleSystem: 'commonjs', platform: 'fastify', nestVersion: '12.0.1' });
