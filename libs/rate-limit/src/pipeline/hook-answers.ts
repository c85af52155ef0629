import type { ExecutionContext } from '@nestjs/common';
import { Deadlines } from '../engine/with-timeout.js';
import { RateLimitTimeoutError } from '../errors/rate-limit.errors.js';
import type { ThrottledLogger } from '../throttled-logger.js';

/** The app's hooks (`keys.apiKey`, keyBy functions, skipIf, per-request numbers) answer within `timeoutMs`, like the store. */
export class HookAnswers {
  /** One timer for every hook's deadline; per-request numbers (`PolicyNumbers`) share it. */
  readonly deadlines: Deadlines;

  constructor(
    timeoutMs: number,
    private readonly logger: ThrottledLogger,
  ) {
    this.deadlines = new Deadlines(timeoutMs);
  }

  /** A hook's answer, or a `RateLimitTimeoutError` once it has taken `timeoutMs`: a hung lookup must not hang the request. */
  bounded<T>(answer: T | PromiseLike<T>): T | Promise<T> {
    const thenable = typeof (answer as PromiseLike<T> | null)?.then === 'function';
    return thenable ? this.deadlines.race(Promise.resolve(answer)) : (answer as T);
  }

  /** A `skipIf` hook's answer: true skips. One that throws or hangs skips nothing (and is logged). */
  async says(hook: (context: ExecutionContext) => boolean | Promise<boolean>, context: ExecutionContext, name: string): Promise<boolean> {
    try {
      return (await this.bounded(hook(context))) === true;
    } catch (error) {
      this.logger.warn(`${name} ${failure(error)}; the policy is applied`);
      return false;
    }
  }
}

/** What went wrong with a hook, for the log: it timed out, or it threw. */
export function failure(error: unknown): string {
  return error instanceof RateLimitTimeoutError ? 'did not answer within timeoutMs' : `threw (${describeError(error)})`;
}

export function describeError(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
