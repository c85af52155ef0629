import { Controller, type ExecutionContext, Get } from '@nestjs/common';
import { RateLimit } from 'nest-redis-rate-limit';

/** The cost a client asks for: `?n=` (a client-controlled cost, as in the README's batch example). */
const askedCost = (context: ExecutionContext): number => Number(context.switchToHttp().getRequest().query.n ?? 1);

/** Issue 22: penalties with a per-request cost, and two routes sharing a `name` with different numbers. */
@Controller('shared')
export class SharedNamesController {
  /** 2 attempts, then a 60 s penalty (1 - 60 = -59 tokens). */
  @Get('strict')
  @RateLimit({ name: 'login-shared', capacity: 2, refillPerSecond: 1, blockSeconds: 60 })
  strict() {
    return { ok: true };
  }

  /** The same bucket with looser numbers and no penalty: 3 at once, 1/s, an idle TTL of 6 s. */
  @Get('loose')
  @RateLimit({ name: 'login-shared', capacity: 3, refillPerSecond: 1 })
  loose() {
    return { ok: true };
  }

  /** 100 at once, 10/s, a 5 s penalty; each request costs what it asks for. */
  @Get('search')
  @RateLimit({ capacity: 100, refillPerSecond: 10, blockSeconds: 5, cost: askedCost })
  search() {
    return { ok: true };
  }
}
