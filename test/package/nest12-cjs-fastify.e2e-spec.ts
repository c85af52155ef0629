import { describeConsumer } from './support/consumer-suite.js';

describeConsumer({ name: 'nest12-cjs-fastify', moduleSystem: 'commonjs', platform: 'fastify', nestVersion: '12.0.1' });
