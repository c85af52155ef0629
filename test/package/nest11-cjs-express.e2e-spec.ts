import { describeConsumer } from './support/consumer-suite.js';

describeConsumer({ name: 'nest11-cjs-express', moduleSystem: 'commonjs', platform: 'express', nestVersion: '11.0.1' });
