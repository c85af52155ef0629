import { Controller, Get } from '@nestjs/common';
import { RateLimitHealth, SkipRateLimit } from 'nest-redis-rate-limit';

@Controller('health')
@SkipRateLimit()
export class HealthController {
  constructor(private readonly rateLimit: RateLimitHealth) {}

  @Get()
  health() {
    return { status: 'ok' };
  }

  /**
   * Whether the limiter limits right now. A public probe gets the verdict only: the reason and the
   * failing nodes name internal addresses, so they belong behind the app's own auth.
   */
  @Get('rate-limit')
  rateLimitStatus() {
    const { status, store, failureMode, fallbackDecisionsLastMinute } = this.rateLimit.status();
    return { status, store, failureMode, fallbackDecisionsLastMinute };
  }
}
