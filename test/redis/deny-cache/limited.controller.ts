import { Controller, Get } from '@nestjs/common';
import { RateLimit } from 'nest-redis-rate-limit';

/** A bucket of 3 refilled every 2 s: a burst of 30 is denied 27 times before a token comes back. */
@Controller('limited')
export class LimitedController {
  @Get()
  @RateLimit(3, 0.5)
  limited() {
    return { ok: true };
  }
}
