import type { Type } from '@nestjs/common';
import { Test } from '@nestjs/testing';

/** Where an application's start stopped, and why: while the module was built, at `app.init()`, or not at all. */
export type StartUpOutcome = { phase: 'compile' | 'init'; message: string } | { phase: 'started' };

const silent = { log() {}, error() {}, warn() {} };

/**
 * What stopped the start, in the library's words: a `RateLimitConfigError`'s `reason`, its message
 * without the lines of its code and help (those are asserted in test/config-errors/error-codes).
 */
export function wordingOf(error: unknown): string {
  return (error as { reason?: string }).reason ?? (error as Error).message;
}

/** Compiles and initialises `module` as an application start would (logs silenced), then closes it. */
export async function startUp(module: Type): Promise<StartUpOutcome> {
  let moduleRef;
  try {
    moduleRef = await Test.createTestingModule({ imports: [module] })
      .setLogger(silent)
      .compile();
  } catch (error) {
    return { phase: 'compile', message: wordingOf(error) };
  }
  const app = moduleRef.createNestApplication({ logger: false });
  try {
    await app.init();
    return { phase: 'started' };
  } catch (error) {
    return { phase: 'init', message: wordingOf(error) };
  } finally {
    await app.close();
  }
}
