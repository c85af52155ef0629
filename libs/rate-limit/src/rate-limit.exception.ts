import { HttpException, HttpStatus, IntrinsicException } from '@nestjs/common';

/**
 * `make()` without capturing a stack trace: a refusal is an answer, not a fault, and capturing the
 * stack costs more than the rest of a locally denied request.
 */
export function withoutStack<T>(make: () => T): T {
  const limit = Error.stackTraceLimit;
  Error.stackTraceLimit = 0;
  try {
    return make();
  } finally {
    Error.stackTraceLimit = limit;
  }
}

/** 429 with a JSON body `{ statusCode, message, retryAfter }`; the guard has set the headers. */
export class RateLimitException extends HttpException {
  constructor(retryAfterSeconds: number, message = 'Too Many Requests') {
    super({ statusCode: HttpStatus.TOO_MANY_REQUESTS, message, retryAfter: retryAfterSeconds }, HttpStatus.TOO_MANY_REQUESTS);
  }

  /** The same exception without a stack trace (see `withoutStack`). */
  static withoutStack(retryAfterSeconds: number): RateLimitException {
    return withoutStack(() => new RateLimitException(retryAfterSeconds));
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
 * it as a fault; the limiter builds it without a stack trace. The HTTP status stays the one the GraphQL server gives
 * (200 for a well-formed request, as GraphQL over HTTP advises): the error and the `Retry-After` header say it.
 */
export class RateLimitedGraphQLError extends IntrinsicException {
  readonly extensions: RateLimitedExtensions;

  constructor(retryAfterSeconds: number, code: RateLimitedExtensions['code'] = 'RATE_LIMITED') {
    super(code === 'RATE_LIMITED' ? 'Too Many Requests' : 'Rate limiting is unavailable; try again shortly');
    this.name = 'RateLimitedGraphQLError';
    this.extensions = { code, retryAfter: retryAfterSeconds };
  }
}

/** What a refused WebSocket or microservice client receives: the `WsException` / `RpcException` error. */
export interface RateLimitedPayload {
  status: 'error';
  code: 'RATE_LIMITED' | 'RATE_LIMIT_UNAVAILABLE';
  message: string;
  retryAfter: number;
}
