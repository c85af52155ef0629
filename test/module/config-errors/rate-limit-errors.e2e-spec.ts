import { ServiceUnavailableException } from '@nestjs/common';
import { inspect } from 'node:util';
import { ERROR_REFERENCE, RATE_LIMIT_ERROR_CODES, referenceOf } from '../../../libs/rate-limit/src/errors/error-codes.js';
import {
  RateLimitConfigError,
  RateLimitError,
  RateLimitTimeoutError,
  RateLimitUnavailableError,
  RateLimitWaitTooLongError,
  reasonOf,
} from '../../../libs/rate-limit/src/errors/rate-limit.errors.js';

const REASON = 'RateLimitModule: unknown key "failuremode" in the options (did you mean "failureMode"?)';

describe('RateLimitConfigError', () => {
  const error = new RateLimitConfigError('ERR_RATE_LIMIT_UNKNOWN_OPTION', REASON);

  it('is an Error and a RateLimitError, named RateLimitConfigError, with the code and its help', () => {
    expect(error).toBeInstanceOf(Error);
    expect(error).toBeInstanceOf(RateLimitError);
    expect(error.name).toBe('RateLimitConfigError');
    expect(error.code).toBe('ERR_RATE_LIMIT_UNKNOWN_OPTION');
    expect(error.help).toBe(RATE_LIMIT_ERROR_CODES.ERR_RATE_LIMIT_UNKNOWN_OPTION);
    expect(error.reason).toBe(REASON);
  });

  it('keeps the wording as the first line, then the code with its help, then the address of its section', () => {
    expect(error.message.split('\n')).toEqual([
      REASON,
      `  [ERR_RATE_LIMIT_UNKNOWN_OPTION] ${RATE_LIMIT_ERROR_CODES.ERR_RATE_LIMIT_UNKNOWN_OPTION}`,
      `  See ${ERROR_REFERENCE}#err_rate_limit_unknown_option`,
    ]);
    expect(error.stack?.startsWith(`RateLimitConfigError: ${REASON}\n  [ERR_RATE_LIMIT_UNKNOWN_OPTION] `)).toBe(true);
  });

  it('prints the code once beside the stack, and the help only in the message', () => {
    const printed = inspect(error);
    expect(printed.match(/ERR_RATE_LIMIT_UNKNOWN_OPTION/g)).toHaveLength(2); // the code line and `code:` (the address has it in lower case)
    expect(printed).toContain("code: 'ERR_RATE_LIMIT_UNKNOWN_OPTION'");
    expect(printed.split(RATE_LIMIT_ERROR_CODES.ERR_RATE_LIMIT_UNKNOWN_OPTION)).toHaveLength(2);
    expect(Object.keys(error)).toEqual(['code']);
  });

  it('answers the wording alone to reasonOf(), and any other error by its message', () => {
    expect(reasonOf(error)).toBe(REASON);
    expect(reasonOf(new Error('plain'))).toBe('plain');
    expect(reasonOf('a string')).toBe('a string');
  });
});

describe('the errors at run time keep their message and carry a code', () => {
  it('RateLimitTimeoutError', () => {
    const error = new RateLimitTimeoutError(200);
    expect(error).toBeInstanceOf(RateLimitError);
    expect(error).not.toBeInstanceOf(RateLimitConfigError);
    expect(error.name).toBe('RateLimitTimeoutError');
    expect(error.message).toBe('rate-limit decision took longer than 200 ms');
    expect(error.code).toBe('ERR_RATE_LIMIT_TIMEOUT');
    expect(error.help).toBe(RATE_LIMIT_ERROR_CODES.ERR_RATE_LIMIT_TIMEOUT);
  });

  it('RateLimitError', () => {
    const error = new RateLimitError('ERR_RATE_LIMIT_STORE_CONTRACT', 'token-bucket script: expected an array, got 1');
    expect(error.name).toBe('RateLimitError');
    expect(error.message).toBe('token-bucket script: expected an array, got 1');
    expect(error.code).toBe('ERR_RATE_LIMIT_STORE_CONTRACT');
  });

  it.each([
    [1, 1],
    [999, 1],
    [1000, 1],
    [1001, 2],
    [1400, 2],
    [1499, 2],
    [2000, 2],
    [2001, 3],
    [59_001, 60],
  ])(
    'RateLimitWaitTooLongError: a wait of %i ms is a Retry-After of %i s (rounded up: never sooner than the tokens)',
    (waitMs, seconds) => {
      const error = new RateLimitWaitTooLongError(waitMs, 500, 'partner');
      expect(error).toBeInstanceOf(RateLimitError);
      expect(error.name).toBe('RateLimitWaitTooLongError');
      expect(error.code).toBe('ERR_RATE_LIMIT_WAIT_TOO_LONG');
      expect(error.message).toBe(`bucket "partner": the tokens come in ${waitMs} ms, more than maxWaitMs 500`);
      expect(error).toMatchObject({ waitMs, maxWaitMs: 500, retryAfterSeconds: seconds });
    },
  );

  it('RateLimitUnavailableError: a 503 whose body is unchanged', () => {
    const error = new RateLimitUnavailableError('failureMode is closed');
    expect(error).toBeInstanceOf(ServiceUnavailableException);
    expect(error.name).toBe('RateLimitUnavailableError');
    expect(error.code).toBe('ERR_RATE_LIMIT_UNAVAILABLE');
    expect(error.help).toBe(RATE_LIMIT_ERROR_CODES.ERR_RATE_LIMIT_UNAVAILABLE);
    expect(error.getStatus()).toBe(503);
    expect(error.getResponse()).toEqual({
      statusCode: 503,
      message: 'Rate limiting is unavailable; try again shortly',
      error: 'Service Unavailable',
    });
    expect((error.cause as Error).message).toBe('rate-limit store unavailable: failureMode is closed');
  });
});

describe('the codes', () => {
  it('are Node-style names, each with one line of help that ends a sentence', () => {
    for (const [code, help] of Object.entries(RATE_LIMIT_ERROR_CODES)) {
      expect(code).toMatch(/^ERR_RATE_LIMIT_[A-Z]+(_[A-Z]+)*$/);
      expect(help).toMatch(/^[^\n]+\.$/);
    }
  });

  it('link to the heading of their section, the code in lower case', () => {
    expect(referenceOf('ERR_RATE_LIMIT_INVALID_POLICY')).toBe(`${ERROR_REFERENCE}#err_rate_limit_invalid_policy`);
  });
});
