import { Controller, Get, type Type } from '@nestjs/common';
import { RateLimit } from 'nest-redis-rate-limit';

/**
 * The controller of the app-stall tests (test/redis/failure-modes/app-stall, test/redis/sentinel/
 * sentinel-app-stall): a limited route, and a handler of the same app that holds the event loop for
 * `blockMs` (a bcrypt hash, a large JSON, a synchronous loop) and is not limited.
 */
export function stallController(capacity: number, blockMs: number): Type {
  @Controller()
  class StallController {
    /** `capacity` tokens, refilled after 1000 s: every admission beyond them per client would be a broken promise. */
    @Get('limited')
    @RateLimit(capacity, 0.001)
    limited() {
      return { ok: true };
    }

    @Get('block')
    block() {
      const until = performance.now() + blockMs;
      while (performance.now() < until);
      return { blocked: true };
    }
  }
  return StallController;
}
