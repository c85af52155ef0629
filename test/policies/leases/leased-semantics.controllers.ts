import { Controller, Get, Module } from '@nestjs/common';
import { RateLimit, RateLimitModule, type RateLimitModuleOptions } from 'nest-redis-rate-limit';

/**
 * Routes of the leased-semantics tests (issue 35, item 4): cost, refusals, shadow mode, analytics, the
 * memory store, Cluster, a Redis that stops answering. Every bucket is shared by all callers.
 */
@Controller('sem')
export class LeasedSemanticsController {
  /** Each request takes 3 tokens of a bucket that hardly refills: at most 1,000 requests are ever admitted. */
  @Get('cost')
  @RateLimit({ capacity: 3_000, refillPerSecond: 0.001, cost: 3, name: 'cost', keyBy: () => 'everyone', lease: { maxBatch: 50 } })
  cost(): string {
    return 'ok';
  }

  /**
   * Drained under load (a bucket is leased once hot, after 200 ms of demand: large enough to outlast
   * that): refusals by the lease's calls and by exact calls, refilling 1 token per second.
   */
  @Get('refuse')
  @RateLimit({ capacity: 1_000, refillPerSecond: 1, name: 'refuse', keyBy: () => 'everyone', lease: { maxBatch: 10, lifeMs: 1_000 } })
  refuse(): string {
    return 'ok';
  }

  /** Shadow mode: drained through the lease, never refusing. */
  @Get('shadow')
  @RateLimit({ capacity: 1_000, refillPerSecond: 1, name: 'shadow', keyBy: () => 'everyone', enforce: false, lease: { maxBatch: 10 } })
  shadow(): string {
    return 'ok';
  }

  /** A large bucket: hot under load, leased in batches of 20 for 600 ms (the outage test). */
  @Get('hot')
  @RateLimit({ capacity: 10_000, refillPerSecond: 1, name: 'hot', keyBy: () => 'everyone', lease: { maxBatch: 20, lifeMs: 600 } })
  hot(): string {
    return 'ok';
  }

  /** Shared by two instances on a Cluster: never more than 1,000 + 20/s admitted. */
  @Get('small')
  @RateLimit({ capacity: 1_000, refillPerSecond: 20, name: 'small', keyBy: () => 'everyone', lease: { lifeMs: 300, maxBatch: 20 } })
  small(): string {
    return 'ok';
  }
}

/** An app of the leased-semantics routes over `options`. */
export function leasedSemanticsAppModule(options: RateLimitModuleOptions) {
  @Module({ imports: [RateLimitModule.forRoot(options)], controllers: [LeasedSemanticsController] })
  class LeasedSemanticsAppModule {}
  return LeasedSemanticsAppModule;
}
