import { describeConsumer } from './support/consumer-suite.js';

describeConsumer({ name: 'nest12-esm-express', moduleSystem: 'esm', platform: 'express', nestVersion: '12.5.1' });
