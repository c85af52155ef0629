import { Controller, Get, Param, UseGuards } from '@nestjs/common';
import { ConcurrencyLimit, RateLimit } from 'nest-redis-rate-limit';
import { DemoUserGuard } from './plans.js';

/** One bucket for the storefront per client address: 20 requests, then 5 a second. */
const STOREFRONT = { capacity: 20, refillPerSecond: 5, name: 'storefront' } as const;

/**
 * Stripe's other limiters, as the guide's recipes (docs/guides/concurrency.md):
 * - a per-user cap on requests in flight for an expensive endpoint (`@ConcurrencyLimit`);
 * - a reserve for what matters: recommendations are sheddable and stop while less than 20 % of the
 *   storefront bucket is left, so checkout keeps its share under a flood of them (`priority`).
 */
@Controller('api')
export class StorefrontController {
  /**
   * An export that takes half a second: at most 2 running per user on every instance, the third gets
   * 429 with `Concurrency-Limit: 2`; and 10 started a minute per user. Both are per user, decided after
   * the app's guards: one Redis call takes the token and the slot together, and a request refused for
   * its slot takes no token. Try `curl -H 'x-user: ann' localhost:3000/api/exports/1/download`.
   */
  @Get('exports/:id/download')
  @UseGuards(DemoUserGuard)
  @RateLimit({ capacity: 10, refillPerSecond: 10 / 60, keyBy: 'user', name: 'export-starts' })
  @ConcurrencyLimit({ limit: 2, keyBy: 'user', name: 'export-downloads' })
  async download(@Param('id') id: string) {
    await new Promise((resolve) => setTimeout(resolve, 500));
    return { export: id, ready: true };
  }

  @Get('recommendations')
  @RateLimit({ ...STOREFRONT, priority: 'sheddable' })
  recommendations() {
    return { items: ['socks', 'mug'] };
  }

  @Get('checkout')
  @RateLimit({ ...STOREFRONT, priority: 'critical' })
  checkout() {
    return { paid: true };
  }
}
