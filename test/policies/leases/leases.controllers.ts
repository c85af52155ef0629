import { Controller, Get, HttpException, Module, Param } from '@nestjs/common';
import { RateLimit, RateLimitModule, type RateLimitModuleOptions } from 'nest-redis-rate-limit';

/** Routes of the leased-mode tests: one hot bucket, one with a refund, one exact beside a leased one. */
@Controller('leased')
export class LeasedController {
  /** A large bucket, leased: hot under load, so most decisions are local. */
  @Get('hot')
  @RateLimit({ capacity: 100_000, refillPerSecond: 100_000, name: 'hot', keyBy: () => 'everyone', lease: true })
  hot(): string {
    return 'ok';
  }

  /** A small bucket, leased, shared by every caller: never more than 200 + 20/s admitted. */
  @Get('small')
  @RateLimit({ capacity: 200, refillPerSecond: 20, name: 'small', keyBy: () => 'everyone', lease: { lifeMs: 300, maxBatch: 20 } })
  small(): string {
    return 'ok';
  }

  /** Leased in small batches: a burst is larger than a batch, and the bucket holds plenty. */
  @Get('burst')
  @RateLimit({ capacity: 10_000, refillPerSecond: 10_000, name: 'burst', keyBy: () => 'everyone', lease: { maxBatch: 10 } })
  burst(): string {
    return 'ok';
  }

  /** Leased, given back when the handler fails. */
  @Get('refund/:outcome')
  @RateLimit({
    capacity: 1_000,
    refillPerSecond: 1,
    name: 'refunded',
    keyBy: () => 'everyone',
    lease: { maxBatch: 50 },
    refundOn: 'failure',
  })
  refund(@Param('outcome') outcome: string): string {
    if (outcome === 'fail') throw new HttpException('upstream failed', 502);
    return 'ok';
  }

  /** A leased global bucket stacked over an exact per-caller one: all or none. */
  @Get('stacked')
  @RateLimit({ capacity: 10_000, refillPerSecond: 10_000, name: 'global', keyBy: () => 'everyone', lease: { maxBatch: 100 } })
  @RateLimit({ capacity: 5, refillPerSecond: 0.001, name: 'per-caller' })
  stacked(): string {
    return 'ok';
  }
}

/** An app of the leased routes over `options`. */
export function leasesAppModule(options: RateLimitModuleOptions) {
  @Module({ imports: [RateLimitModule.forRoot(options)], controllers: [LeasedController] })
  class LeasesAppModule {}
  return LeasesAppModule;
}
