import { Controller, Get } from '@nestjs/common';
import { RateLimit } from 'nest-redis-rate-limit';

@Controller('raw')
export class RawKeyController {
  /** Limited by the API key alone: a made-up key per request is a new bucket per request. */
  @Get('only-key')
  @RateLimit(2, 1, 'apiKey')
  onlyKey() {
    return { ok: true };
  }

  /** Named, and still only by key. */
  @Get('reports')
  @RateLimit({ capacity: 5, refillPerSecond: 1, keyBy: 'apiKey', name: 'reports' })
  reports() {
    return { ok: true };
  }

  /** A per-IP budget beside the per-key limit: rotating keys from one address stays within it. */
  @Get('stacked')
  @RateLimit({ capacity: 5, refillPerSecond: 1, keyBy: 'ip', name: 'ip-budget' })
  @RateLimit({ capacity: 2, refillPerSecond: 1, keyBy: 'apiKey', name: 'per-key' })
  stacked() {
    return { ok: true };
  }

  /** A per-IP budget in shadow mode refuses nothing: no bound on rotating keys. */
  @Get('shadow-ip')
  @RateLimit({ capacity: 5, refillPerSecond: 1, keyBy: 'ip', name: 'shadow-ip', enforce: false })
  @RateLimit({ capacity: 2, refillPerSecond: 1, keyBy: 'apiKey', name: 'shadow-key' })
  shadowIp() {
    return { ok: true };
  }

  @Get('ip')
  @RateLimit(2, 1)
  ip() {
    return { ok: true };
  }
}

@Controller('open')
export class OpenController {
  @Get()
  open() {
    return { ok: true };
  }
}
