import { ServiceUnavailableException } from '@nestjs/common';
import { RATE_LIMIT_ERROR_CODES, type RateLimitErrorCode, referenceOf } from './error-codes.js';

/**
 * The library's errors, in one place. Each carries a stable `code` (see `RATE_LIMIT_ERROR_CODES`) and
 * a line of `help`. Refusals are not here: `RateLimitException` (429) and its GraphQL, WebSocket and
 * microservice forms are answers to a client, not errors of the app.
 */

/** Sets `help`, not enumerable: it is in the message (or the docs) already, and need not be printed twice. */
function defineHelp(error: Error, code: RateLimitErrorCode): void {
  Object.defineProperty(error, 'help', { value: RATE_LIMIT_ERROR_CODES[code], enumerable: false, writable: false, configurable: true });
}

/**
 * An error of the library at run time, or one that points to a bug: its message is left as it is (it
 * is logged inside other lines), the code is in `code`. `RateLimitConfigError` and
 * `RateLimitTimeoutError` are kinds of it.
 */
export class RateLimitError extends Error {
  /** Stable: match on it rather than on the message. */
  readonly code: RateLimitErrorCode;
  /** One line: what to do. */
  declare readonly help: string;

  constructor(code: RateLimitErrorCode, message: string, options?: ErrorOptions) {
    super(message, options);
    this.code = code;
    defineHelp(this, code);
  }
}
RateLimitError.prototype.name = 'RateLimitError';

/**
 * A mistake in the configuration: an option, a policy, the wiring of the module, a call of
 * `BucketService` or `ConnectionRateLimit`. Thrown at start-up (or at the call), never while serving a
 * request. The message is the library's wording, then a line with the code and the help, then the
 * address of the code's section in the error reference:
 *
 *     RateLimitModule: unknown key "failuremode" in the options (did you mean "failureMode"?)
 *       [ERR_RATE_LIMIT_UNKNOWN_OPTION] Correct the key's spelling (...) or remove it.
 *       See https://github.com/.../docs/reference/errors.md#err_rate_limit_unknown_option
 */
export class RateLimitConfigError extends RateLimitError {
  /** The message without the code's lines: what went wrong, in the library's words. */
  declare readonly reason: string;

  constructor(code: RateLimitErrorCode, reason: string) {
    super(code, `${reason}\n  [${code}] ${RATE_LIMIT_ERROR_CODES[code]}\n  See ${referenceOf(code)}`);
    Object.defineProperty(this, 'reason', { value: reason, enumerable: false, writable: false, configurable: true });
  }
}
RateLimitConfigError.prototype.name = 'RateLimitConfigError';

/** What went wrong, without the code's lines of a `RateLimitConfigError`: for a message that quotes another error. */
export function reasonOf(error: unknown): string {
  if (error instanceof RateLimitConfigError) return error.reason;
  return error instanceof Error ? error.message : String(error);
}

/**
 * An operator's change or question (`RateLimitInsights`, the dashboard) with invalid input: nothing was
 * changed. The message names the field and why, and never repeats an API key; a caller answers it with 400.
 */
export class RateLimitInputError extends RateLimitError {
  constructor(message: string) {
    super('ERR_RATE_LIMIT_INVALID_OPERATION', message);
  }
}
RateLimitInputError.prototype.name = 'RateLimitInputError';

/** A store decision took longer than `timeoutMs`. */
export class RateLimitTimeoutError extends RateLimitError {
  constructor(timeoutMs: number) {
    super('ERR_RATE_LIMIT_TIMEOUT', `rate-limit decision took longer than ${timeoutMs} ms`);
  }
}
RateLimitTimeoutError.prototype.name = 'RateLimitTimeoutError';

/**
 * `BucketService.acquire()` (or a `@Paced` method) would have to wait longer than its `maxWaitMs`: nothing
 * was reserved. `waitMs` is the wait it would have needed, `retryAfterSeconds` the same in whole seconds.
 */
export class RateLimitWaitTooLongError extends RateLimitError {
  readonly retryAfterSeconds: number;

  constructor(
    readonly waitMs: number,
    readonly maxWaitMs: number,
    bucket: string,
  ) {
    super('ERR_RATE_LIMIT_WAIT_TOO_LONG', `bucket "${bucket}": the tokens come in ${waitMs} ms, more than maxWaitMs ${maxWaitMs}`);
    this.retryAfterSeconds = Math.max(1, Math.ceil(waitMs / 1000));
  }
}
RateLimitWaitTooLongError.prototype.name = 'RateLimitWaitTooLongError';

/**
 * `BucketService.withSlot()`: every concurrency slot of the name is in use (and none came within
 * `maxWaitMs`): the work did not run. `retryAfterSeconds` is a hint (slots free when work finishes).
 */
export class RateLimitConcurrencyError extends RateLimitError {
  constructor(
    readonly limit: number,
    readonly inFlight: number,
    readonly retryAfterSeconds: number,
    name: string,
  ) {
    super('ERR_RATE_LIMIT_CONCURRENCY_LIMITED', `concurrency slots "${name}": all ${limit} are in use`);
  }
}
RateLimitConcurrencyError.prototype.name = 'RateLimitConcurrencyError';

/** What an aborted wait rejects with: an `AbortError` (as Node's own timers give), its `cause` the signal's reason. */
export function abortError(signal: AbortSignal, what = 'a token'): Error {
  const error = new Error(`The wait for ${what} was aborted`, { cause: signal.reason });
  error.name = 'AbortError';
  Object.defineProperty(error, 'code', { value: 'ABORT_ERR', enumerable: true });
  return error;
}

/**
 * The store could not decide and `failureMode` is `'closed'`. A `ServiceUnavailableException`, so a
 * Nest application that lets it propagate answers 503 with the same body the guard sends
 * (`{ statusCode: 503, message: 'Rate limiting is unavailable; try again shortly', error: 'Service Unavailable' }`);
 * `cause` says why. Its message is what the client reads, so the code is only in `code`.
 */
export class RateLimitUnavailableError extends ServiceUnavailableException {
  readonly code = 'ERR_RATE_LIMIT_UNAVAILABLE' satisfies RateLimitErrorCode;
  declare readonly help: string;

  constructor(cause: unknown) {
    super('Rate limiting is unavailable; try again shortly', {
      description: 'Service Unavailable',
      // Not a library error of its own: only the words of `cause` when a string says why (`failureMode is closed`).
      cause: typeof cause === 'string' ? new Error(`rate-limit store unavailable: ${cause}`) : cause,
    });
    this.name = 'RateLimitUnavailableError';
    defineHelp(this, this.code);
  }
}
