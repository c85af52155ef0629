import { HttpException, HttpStatus } from '@nestjs/common';

/** 429 with a JSON body `{ statusCode, message, retryAfter }`; the guard has set the headers. */
export class RateLimitException extends HttpException {
  constructor(retryAfterSeconds: number, message = 'Too Many Requests') {
    super({ statusCode: HttpStatus.TOO_MANY_REQUESTS, message, retryAfter: retryAfterSeconds }, HttpStatus.TOO_MANY_REQUESTS);
  }

  /**
   * The same exception without a stack trace: a 429 is an answer, not a fault, and capturing the stack
   * costs more than the rest of a locally denied request.
   */
  static withoutStack(retryAfterSeconds: number): RateLimitException {
    const limit = Error.stackTraceLimit;
    Error.stackTraceLimit = 0;
    try {
      return new RateLimitException(retryAfterSeconds);
    } finally {
      Error.stackTraceLimit = limit;
    }
  }
}
