import { Controller, Get } from '@nestjs/common';
import { RateLimit, SkipRateLimit } from 'nest-redis-rate-limit';

@Controller('open')
export class OpenController {
  @Get()
  open() {
    return { ok: true };
  }
}

@Controller('class-limited')
@RateLimit(1, 0.01)
export class ClassLimitedController {
  @Get('inherits')
  inherits() {
    return { ok: true };
  }

  @Get('overrides')
  @RateLimit(3, 0.01)
  overrides() {
    return { ok: true };
  }

  @Get('skipped')
  @SkipRateLimit()
  skipped() {
    return { ok: true };
  }
}

@Controller('class-skipped')
@SkipRateLimit()
export class ClassSkippedController {
  @Get()
  skipped() {
    return { ok: true };
  }

  @Get('limited')
  @RateLimit(2, 0.01)
  limited() {
    return { ok: true };
  }
}
