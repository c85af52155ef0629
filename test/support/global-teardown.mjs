import { register } from 'node:module';

/** jest globalTeardown: stops the run's Redis and kills every child a test left running (test-run.ts). */
// Once per process: globalSetup and globalTeardown run in the same one.
if (!globalThis.__rlTestTsLoader) {
  register('./ts-loader.mjs', import.meta.url);
  globalThis.__rlTestTsLoader = true;
}

export default async function globalTeardown() {
  const { tearDownTestRun } = await import('./test-run.ts');
  await tearDownTestRun();
}
