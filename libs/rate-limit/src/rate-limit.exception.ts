import { HttpException, HttpStatus, IntrinsicException } from '@nestjs/common';

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

/** What a GraphQL client finds in `errors[].extensions` when a resolver is refused. */
export interface RateLimitedExtensions {
  code: 'RATE_LIMITED' | 'RATE_LIMIT_UNAVAILABLE';
  retryAfter: number;
}

/**
 * A refusal of a GraphQL resolver: the field's error, with `extensions: { code: 'RATE_LIMITED',
 * retryAfter }` (graphql-js copies an error's `extensions`), and `RATE_LIMIT_UNAVAILABLE` when
 * `failureMode: 'closed'` refuses because Redis fails. An `IntrinsicException`, so Nest does not log
 * it as a fault; built without a stack trace. The HTTP status stays the one the GraphQL server gives
 * (200 for a well-formed request, as GraphQL over HTTP advises): the error and the `Retry-After` header say it.
 */
export class RateLimitedGraphQLError extends IntrinsicException {
  readonly extensions: RateLimitedExtensions;

  constructor(retryAfterSeconds: number, code: RateLimitedExtensions['code'] = 'RATE_LIMITED') {
    const limit = Error.stackTraceLimit;
    Error.stackTraceLimit = 0;
    try {
      super(code === 'RATE_LIMITED' ? 'Too Many Requests' : 'Rate limiting is unavailable; try again shortly');
    } finally {
      Error.stackTraceLimit = limit;
    }
    this.name = 'RateLimitedGraphQLError';
    this.extensions = { code, retryAfter: retryAfterSeconds };
  }
}
