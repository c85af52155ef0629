import { Controller, Get } from '@nestjs/common';
import { ConcurrencyLimit, RateLimit } from 'nest-redis-rate-limit';

/** Capacities no test exhausts unless it means to, refills too slow to matter. */
const ROOMY = { capacity: 1000, refillPerSecond: 0.01 } as const;

@Controller('rt')
export class RoundTripController {
  @Get('free')
  free() {
    return { ok: true };
  }

  @Get('single')
  @RateLimit(ROOMY.capacity, ROOMY.refillPerSecond)
  single() {
    return { ok: true };
  }

  /** Two policies on the same identity. */
  @Get('double')
  @RateLimit({ ...ROOMY, name: 'rt-burst' })
  @RateLimit({ ...ROOMY, name: 'rt-hourly' })
  double() {
    return { ok: true };
  }

  /** Two policies on different identities: still one script call on a single Redis server. */
  @Get('mixed')
  @RateLimit({ ...ROOMY, keyBy: 'ip', name: 'rt-ip' })
  @RateLimit({ ...ROOMY, keyBy: 'apiKey', name: 'rt-key' })
  mixed() {
    return { ok: true };
  }

  @Get('tight')
  @RateLimit(5, 0.01)
  tight() {
    return { ok: true };
  }

  /** A rate policy and a concurrency limit decided in the same phase: one call takes both (take-with-slot.lua). */
  @Get('slot')
  @RateLimit({ ...ROOMY, name: 'rt-slot-rate', phase: 'after-guards' })
  @ConcurrencyLimit({ limit: 5, name: 'rt-slot' })
  slot() {
    return { ok: true };
  }
}
