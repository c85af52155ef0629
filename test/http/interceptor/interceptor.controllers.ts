import { Controller, Get, Req } from '@nestjs/common';
import { RATE_LIMIT_VERDICT, RateLimit, type RateLimitState, SkipRateLimit } from 'nest-redis-rate-limit';

@Controller('open')
export class UnlimitedController {
  @Get()
  get() {
    return { ok: true };
  }
}

@Controller('limited')
@RateLimit(5, 0.001, 'ip')
export class LimitedController {
  /** Per-IP on the class; a per-IP and a per-tenant policy (after the guards) on the handler. */
  @Get('stacked')
  @RateLimit({ capacity: 4, refillPerSecond: 0.001, keyBy: 'ip', name: 'stacked-ip' })
  @RateLimit({
    capacity: 3,
    refillPerSecond: 0.001,
    keyBy: (ctx) => ctx.switchToHttp().getRequest().headers['x-tenant'],
    name: 'stacked-tenant',
  })
  stacked(@Req() request: Record<symbol, RateLimitState>) {
    const state = request[RATE_LIMIT_VERDICT];
    return {
      scopes: state.policies.map((p) => (p as { scope: string }).scope),
      phases: state.policies.map((p) => (p as { phase: string }).phase),
      allowed: state.verdict?.allowed,
      source: state.verdict?.source,
      remaining: state.verdict?.decisions.map((d) => d.remaining),
    };
  }

  /** A user policy, stacked twice on the handler (one interceptor), under a per-IP class policy. */
  @Get('by-user')
  @RateLimit({ capacity: 2, refillPerSecond: 0.001, keyBy: 'user', name: 'by-user' })
  @RateLimit({ capacity: 3, refillPerSecond: 0.001, keyBy: 'user', name: 'by-user-b' })
  byUser() {
    return { ok: true };
  }

  /** Decided by the guard alone: what it leaves on the request is the whole state. */
  @Get('class')
  byClass(@Req() request: Record<symbol, RateLimitState>) {
    const { policies, verdict } = request[RATE_LIMIT_VERDICT];
    return { scopes: policies.map((p) => (p as { scope: string }).scope), verdict };
  }

  @Get('skipped')
  @SkipRateLimit()
  skipped() {
    return { ok: true };
  }
}
