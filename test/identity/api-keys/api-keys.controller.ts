import { Controller, Get } from '@nestjs/common';
import { RateLimit } from 'nest-redis-rate-limit';

@Controller('keys')
export class ApiKeysController {
  /** Limited by API key only: safe only when keys are verified (keys.apiKey). */
  @Get('only-key')
  @RateLimit(2, 0.001, 'apiKey')
  onlyKey() {
    return { ok: true };
  }

  /** The pattern that holds with unverified keys: a per-IP budget stacked with the per-key limit. */
  @Get('stacked')
  @RateLimit({ capacity: 5, refillPerSecond: 0.001, keyBy: 'ip', name: 'ip-budget' })
  @RateLimit({ capacity: 2, refillPerSecond: 0.001, keyBy: 'apiKey', name: 'per-key' })
  stacked() {
    return { ok: true };
  }
}
