import { Controller, Get, Module, Req } from '@nestjs/common';
import { RATE_LIMIT_VERDICT, RateLimit, RateLimitModule, type RateLimitModuleOptions, type RateLimitState } from 'nest-redis-rate-limit';

/** Never refills within a test. */
export const SLOW = 0.001;

/** What the limiter left on the request, in a form the test can read. */
function stateOf(request: Record<symbol, RateLimitState>) {
  const state = request[RATE_LIMIT_VERDICT];
  return {
    enforced: state.policies.map((p) => p.scope),
    allowed: state.verdict?.allowed,
    shadow:
      state.shadow === undefined
        ? undefined
        : {
            policies: state.shadow.policies.map((p) => p.scope),
            allowed: state.shadow.verdict.allowed,
            remaining: state.shadow.verdict.decisions.map((d) => d.remaining),
          },
  };
}

@Controller('sh')
export class ShadowController {
  /** A shadow policy alone. */
  @Get('only')
  @RateLimit({ capacity: 2, refillPerSecond: SLOW, name: 'sh-only', enforce: false })
  only(@Req() request: Record<symbol, RateLimitState>) {
    return stateOf(request);
  }

  /** An enforced policy (3) beside a shadow one (1). */
  @Get('mixed')
  @RateLimit({ capacity: 3, refillPerSecond: SLOW, name: 'mx-enf' })
  @RateLimit({ capacity: 1, refillPerSecond: SLOW, name: 'mx-sh', enforce: false })
  mixed(@Req() request: Record<symbol, RateLimitState>) {
    return stateOf(request);
  }

  /** Exactness: an enforced policy of 5 beside a shadow one of 2. */
  @Get('exact')
  @RateLimit({ capacity: 5, refillPerSecond: SLOW, name: 'ex-enf' })
  @RateLimit({ capacity: 2, refillPerSecond: SLOW, name: 'ex-sh', enforce: false })
  exact() {
    return { ok: true };
  }

  /** Enforced whatever the module says. */
  @Get('forced')
  @RateLimit({ capacity: 2, refillPerSecond: SLOW, name: 'forced', enforce: true })
  forced(@Req() request: Record<symbol, RateLimitState>) {
    return stateOf(request);
  }

  /** A plain enforced policy, for onDecision. */
  @Get('plain')
  @RateLimit({ capacity: 2, refillPerSecond: SLOW, name: 'pl' })
  plain() {
    return { ok: true };
  }
}

export function shadowAppModule(options: RateLimitModuleOptions) {
  @Module({ imports: [RateLimitModule.forRoot(options)], controllers: [ShadowController] })
  class ShadowAppModule {}
  return ShadowAppModule;
}
