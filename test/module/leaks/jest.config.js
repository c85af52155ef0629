import main from '../../../jest.config.js';

/**
 * The small jest run that test/module/leaks/no-leaks.e2e-spec.ts starts: the fixtures, which leave
 * redis-server and app processes running on purpose, with the project's globalSetup/globalTeardown.
 */
const [fast] = main.projects;

export default {
  ...fast,
  displayName: 'leak-fixtures',
  rootDir: '../../..',
  testMatch: ['<rootDir>/test/module/leaks/fixtures/*.leak-spec.ts'],
  testPathIgnorePatterns: ['/node_modules/'],
  maxWorkers: 2,
};
