import { Controller, Get } from '@nestjs/common';
import { RateLimit } from 'nest-redis-rate-limit';

/** Refill so slow (one token per 100 s) that a burst's numbers cannot move while a test runs. */
export const SLOW = 0.01;

@Controller('limited')
export class LimitedController {
  @Get('burst')
  @RateLimit(100, SLOW)
  burst() {
    return { ok: true };
  }

  @Get('costly')
  @RateLimit({ capacity: 10, refillPerSecond: SLOW, cost: 4, name: 'costly-reports' })
  costly() {
    return { ok: true };
  }
}
