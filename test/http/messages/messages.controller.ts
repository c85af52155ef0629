import { Controller, Get } from '@nestjs/common';
import { BucketService, RateLimit } from 'nest-redis-rate-limit';

@Controller('messages')
export class MessagesController {
  constructor(private readonly buckets: BucketService) {}

  /** Meters exports with BucketService, as an application does for work that is not a route. */
  @Get('export')
  async export() {
    const decision = await this.buckets.consume('messages-export', { capacity: 5, refillPerSecond: 1 });
    return { allowed: decision.allowed };
  }

  /**
   * Two policies: `slow` (3 tokens, 1/s) runs out first; `fast` (2 tokens, 1000/s) is full again before
   * every request. On the 4th request `slow` refuses while `fast` has its token.
   */
  @Get('two-policies')
  @RateLimit({ capacity: 3, refillPerSecond: 1, name: 'slow' })
  @RateLimit({ capacity: 2, refillPerSecond: 1000, name: 'fast' })
  twoPolicies() {
    return 'ok';
  }
}
