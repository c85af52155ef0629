import { HttpException, HttpStatus } from '@nestjs/common';

/** 429 with a JSON body `{ statusCode, message, retryAfter }`; the guard has set the headers. */
export class RateLimitException extends HttpException {
  constructor(retryAfterSeconds: number, message = 'Too Many Requests') {
    super({ statusCode: HttpStatus.TOO_MANY_REQUESTS, message, retryAfter: retryAfterSeconds }, HttpStatus.TOO_MANY_REQUESTS);
  }
}
