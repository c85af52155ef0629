import { Controller, Get } from '@nestjs/common';
import { RateLimit } from 'nest-redis-rate-limit';

/** Room enough that nothing here is ever refused: these tests count the work on the request's path, not its verdict. */
const ROOMY = { capacity: 1000, refillPerSecond: 0.001 };

@Controller('path')
export class PathController {
  /** Decided by the guard alone. */
  @Get('ip')
  @RateLimit({ ...ROOMY, keyBy: 'ip' })
  ip() {
    return { ok: true };
  }

  /** A policy for each phase: the guard and then the interceptor decide. */
  @Get('both')
  @RateLimit({ ...ROOMY, keyBy: 'ip', name: 'path-both-before' })
  @RateLimit({ ...ROOMY, keyBy: 'ip', name: 'path-both-after', phase: 'after-guards' })
  both() {
    return { ok: true };
  }
}

/** For `guard: false`: its only route has the interceptor (an after-guards policy), and a policy due before the app's guards. */
@Controller('no-guard')
export class NoGuardController {
  @Get()
  @RateLimit({ ...ROOMY, keyBy: 'ip', name: 'no-guard-before' })
  @RateLimit({ ...ROOMY, keyBy: 'ip', name: 'no-guard-after', phase: 'after-guards' })
  get() {
    return { ok: true };
  }
}
