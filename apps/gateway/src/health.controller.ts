import { Controller, Get } from '@nestjs/common';
import { SkipRateLimit } from 'nest-redis-rate-limit';

@Controller('health')
@SkipRateLimit()
export class HealthController {
  @Get()
  health() {
    return { status: 'ok' };
  }
}
