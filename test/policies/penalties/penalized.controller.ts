import { Controller, Get } from '@nestjs/common';
import { RateLimit } from 'nest-redis-rate-limit';

/** Routes with penalties: a refusal makes the client wait `blockSeconds`, however often it retries. */
@Controller('penalized')
export class PenalizedController {
  /** 2 requests, then a refusal starts a 30 s penalty (the bucket goes to 1 - 30 = -29 tokens). */
  @Get('login')
  @RateLimit({ capacity: 2, refillPerSecond: 1, blockSeconds: 30 })
  login() {
    return { ok: true };
  }

  /** For the parallel burst: 5 requests, then a 30 s penalty (1 - 30 × 0.5 = -14 tokens). */
  @Get('burst')
  @RateLimit({ capacity: 5, refillPerSecond: 0.5, blockSeconds: 30 })
  burst() {
    return { ok: true };
  }

  /** A short penalty (2 s) on a bucket of 3, to see a penalty end and the next refusal start a new one. */
  @Get('short')
  @RateLimit({ capacity: 3, refillPerSecond: 1, blockSeconds: 2 })
  short() {
    return { ok: true };
  }
}
