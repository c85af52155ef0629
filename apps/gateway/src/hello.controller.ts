import { Controller, Get } from '@nestjs/common';
import { RateLimit } from 'nest-redis-rate-limit';

@Controller('api')
export class HelloController {
  /**
   * Burst of 100, then 20 per second, per verified API key (per IP without one); and at most 150, then
   * 30 per second, per IP whatever keys it sends, so one address cannot multiply its rate with many keys.
   */
  @Get('hello')
  @RateLimit(100, 20, 'apiKey')
  @RateLimit({ capacity: 150, refillPerSecond: 30, keyBy: 'ip', name: 'api-per-ip' })
  hello() {
    return { message: 'Hello' };
  }

  /** An expensive route: each report costs 10 of a 50-token bucket per verified key that refills 1 per second. */
  @Get('report')
  @RateLimit({ capacity: 50, refillPerSecond: 1, cost: 10, keyBy: 'apiKey', name: 'reports' })
  report() {
    return { rows: Array.from({ length: 10 }, (_, i) => ({ id: i + 1, value: (i + 1) ** 2 })) };
  }
}
