import { describeConsumer } from './support/consumer-suite.js';

/** (a) NestJS 12.5.1 as an ES module app (`"type": "module"`), `strict: true`, Express; ioredis 6, TypeScript 6. */
describeConsumer({ name: 'nest12-esm-express', moduleSystem: 'esm', platform: 'express', nestVersion: '12.5.1' });
