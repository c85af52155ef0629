import type { Type } from '@nestjs/common';
import { Test } from '@nestjs/testing';

/** Where an application's start stopped, and why: while the module was built, at `app.init()`, or not at all. */
export type StartUpOutcome = { phase: 'compile' | 'init'; message: string } | { phase: 'started' };

const silent = { log() {}, error() {}, warn() {} };

/** Compiles and initialises `module` as an application start would (logs silenced), then closes it. */
export async function startUp(module: Type): Promise<StartUpOutcome> {
  let moduleRef;
  try {
    moduleRef = await Test.createTestingModule({ imports: [module] })
      .setLogger(silent)
      .compile();
  } catch (error) {
    return { phase: 'compile', message: (error as Error).message };
  }
  const app = moduleRef.createNestApplication({ logger: false });
  try {
    await app.init();
    return { phase: 'started' };
  } catch (error) {
    return { phase: 'init', message: (error as Error).message };
  } finally {
    await app.close();
  }
}
