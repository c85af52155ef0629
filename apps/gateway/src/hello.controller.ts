import { Controller, Get, Headers } from '@nestjs/common';
import { RateLimit } from 'nest-redis-rate-limit';

@Controller('api')
export class HelloController {
  /** Burst of 100, then 20 per second, per API key (per IP without one). */
  @Get('hello')
  @RateLimit(100, 20, 'apiKey')
  hello(@Headers('x-api-key') apiKey?: string) {
    return { message: 'Hello', authenticated: apiKey !== undefined };
  }

  /** An expensive route: each report costs 10 of a 50-token bucket that refills 1 per second. */
  @Get('report')
  @RateLimit({ capacity: 50, refillPerSecond: 1, cost: 10, keyBy: 'apiKey', name: 'reports' })
  report() {
    return { rows: Array.from({ length: 10 }, (_, i) => ({ id: i + 1, value: (i + 1) ** 2 })) };
  }
}
