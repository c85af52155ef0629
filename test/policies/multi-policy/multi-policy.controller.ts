import { Controller, Get } from '@nestjs/common';
import { RateLimit } from 'nest-redis-rate-limit';

/** Refills so slow (one token per 100 s, three per hour) that counts cannot move while a test runs. */
export const BURST = { capacity: 10, refillPerSecond: 0.01 } as const;
export const HOURLY = { capacity: 3, refillPerSecond: 3 / 3600 } as const;

@Controller('multi')
export class MultiPolicyController {
  /** A generous burst limit and a tight hourly quota: the quota denies first. */
  @Get('quota')
  @RateLimit({ ...BURST, name: 'burst' })
  @RateLimit({ ...HOURLY, name: 'hourly' })
  quota() {
    return { ok: true };
  }

  /** A tight burst limit that refills in 10 s per token and a loose hourly quota: the burst denies first. */
  @Get('burst')
  @RateLimit({ capacity: 2, refillPerSecond: 0.1, name: 'tight-burst' })
  @RateLimit({ capacity: 100, refillPerSecond: 100 / 3600, name: 'loose-hourly' })
  burst() {
    return { ok: true };
  }

  /** Equal remaining counts after one request (4 - 2 and 3 - 1): the smaller capacity is described. */
  @Get('tie')
  @RateLimit({ capacity: 4, refillPerSecond: 0.01, cost: 2, name: 'tie-big' })
  @RateLimit({ capacity: 3, refillPerSecond: 0.01, name: 'tie-small' })
  tie() {
    return { ok: true };
  }

  /** Unnamed stacked policies: scopes `MultiPolicyController.unnamed#0` and `#1`. */
  @Get('unnamed')
  @RateLimit(5, 0.01)
  @RateLimit(2, 0.01)
  unnamed() {
    return { ok: true };
  }
}
