import { Controller, Get } from '@nestjs/common';
import { SkipRateLimit } from '@app/rate-limit';

@Controller('health')
@SkipRateLimit()
export class HealthController {
  @Get()
  health() {
    return { status: 'ok' };
  }
}
