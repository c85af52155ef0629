import { Controller, Get, Req } from '@nestjs/common';
import { RateLimit } from 'nest-redis-rate-limit';

/** Two tokens per client address that do not refill within a test: the third request of one address is a 429. */
@Controller('addresses')
export class AddressesController {
  @Get('limited')
  @RateLimit(2, 0.001)
  limited(@Req() req: { ip?: string }) {
    return { ip: req.ip };
  }

  /** What the platform made of the request's address, unlimited. */
  @Get('ip')
  ip(@Req() req: { ip?: string }) {
    return { ip: req.ip };
  }
}
