import { type CallHandler, type ExecutionContext, Injectable, type NestInterceptor } from '@nestjs/common';
import type { Observable } from 'rxjs';
import type { RateLimitState } from '../guards/rate-limit.guard.js';
import { RateLimitHeadersWriter } from '../headers/rate-limit-headers.writer.js';
import { RATE_LIMIT_VERDICT } from '../rate-limit.constants.js';

/**
 * Sets the rate-limit headers from the verdict the guard left on the request.
 * @deprecated `RateLimitModule` no longer registers it: the guard writes the headers itself, and
 * registering this interceptor only repeats that work at the cost of an interceptor on every route.
 */
@Injectable()
export class RateLimitHeadersInterceptor implements NestInterceptor {
  constructor(private readonly headers: RateLimitHeadersWriter) {}

  intercept(context: ExecutionContext, next: CallHandler): Observable<unknown> {
    if (context.getType() === 'http') {
      const http = context.switchToHttp();
      const state: RateLimitState | undefined = http.getRequest()[RATE_LIMIT_VERDICT];
      if (state !== undefined) this.headers.write(http.getResponse(), state.policies, state.verdict);
    }
    return next.handle();
  }
}
