import { register } from 'node:module';

/** jest globalSetup: one Redis for the run, and a record of every child the tests spawn (test-run.ts). */
// Once per process: globalSetup and globalTeardown run in the same one.
if (!globalThis.__rlTestTsLoader) {
  register('./ts-loader.mjs', import.meta.url);
  globalThis.__rlTestTsLoader = true;
}

export default async function globalSetup() {
  const { setUpTestRun } = await import('./test-run.ts');
  await setUpTestRun();
}
