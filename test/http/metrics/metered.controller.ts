import { Controller, Get } from '@nestjs/common';
import { RateLimit } from 'nest-redis-rate-limit';

/** One token per 100 s: nothing refills while a test runs. */
export const SLOW = 0.01;

@Controller('metered')
export class MeteredController {
  /** Capacity 2: the second request leaves 0 tokens (below 10% of 2), the third is denied. */
  @Get()
  @RateLimit({ capacity: 2, refillPerSecond: SLOW, name: 'metered' })
  limited() {
    return { ok: true };
  }

  /** A shadow policy: decided and drained, never refused. */
  @Get('shadow')
  @RateLimit({ capacity: 1, refillPerSecond: SLOW, name: 'shadowed', enforce: false })
  shadow() {
    return { ok: true };
  }

  /** An unnamed policy: its scope is Controller.handler. Capacity 20, where 10 % (2 tokens) is a boundary a test can cross. */
  @Get('unnamed')
  @RateLimit(20, SLOW)
  unnamed() {
    return { ok: true };
  }
}
