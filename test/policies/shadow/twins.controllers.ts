import {
  type CanActivate,
  Controller,
  type ExecutionContext,
  Get,
  HttpException,
  Injectable,
  Module,
  Query,
  UseGuards,
} from '@nestjs/common';
import { RateLimit, RateLimitModule, type RateLimitModuleOptions } from 'nest-redis-rate-limit';

/** Never refills within a test. */
const SLOW = 0.001;

/** The app's own auth guard: `req.user` from `x-user`, so user-keyed policies are decided after it (phase 2). */
@Injectable()
class HeaderUserGuard implements CanActivate {
  canActivate(context: ExecutionContext): boolean {
    const request = context.switchToHttp().getRequest();
    const id = request.headers['x-user'];
    if (typeof id === 'string') request.user = { id };
    return true;
  }
}

const fail = (failed?: string) => {
  if (failed === '1') throw new HttpException('failed on purpose', 502);
  return { ok: true };
};

/**
 * Each route twice: with the policy under test (10 tokens, or 5 for refunds) enforced, and in shadow
 * (`enforce: false`). Its twin's bucket is what the shadow bucket must show.
 */
@Controller('twin')
@UseGuards(HeaderUserGuard)
export class TwinController {
  /** One phase: the policy beside a stricter enforced one (2). */
  @Get('stacked-enforced')
  @RateLimit({ capacity: 2, refillPerSecond: SLOW, name: 'st-e-strict' })
  @RateLimit({ capacity: 10, refillPerSecond: SLOW, name: 'st-e' })
  stackedEnforced() {
    return { ok: true };
  }

  @Get('stacked-shadow')
  @RateLimit({ capacity: 2, refillPerSecond: SLOW, name: 'st-s-strict' })
  @RateLimit({ capacity: 10, refillPerSecond: SLOW, name: 'st-s', enforce: false })
  stackedShadow() {
    return { ok: true };
  }

  /** Two phases: the policy by IP (before the app's guards), a stricter one by user (after them). */
  @Get('phased-enforced')
  @RateLimit({ capacity: 10, refillPerSecond: SLOW, name: 'ph-e' })
  @RateLimit({ capacity: 2, refillPerSecond: SLOW, name: 'ph-e-strict', keyBy: 'user' })
  phasedEnforced() {
    return { ok: true };
  }

  @Get('phased-shadow')
  @RateLimit({ capacity: 10, refillPerSecond: SLOW, name: 'ph-s', enforce: false })
  @RateLimit({ capacity: 2, refillPerSecond: SLOW, name: 'ph-s-strict', keyBy: 'user' })
  phasedShadow() {
    return { ok: true };
  }

  /** The policy by user (phase 2) in shadow, refusing: the IP policy of phase 1 is shadow too. */
  @Get('late-shadow-enforced')
  @RateLimit({ capacity: 10, refillPerSecond: SLOW, name: 'ls-e' })
  @RateLimit({ capacity: 2, refillPerSecond: SLOW, name: 'ls-e-user', keyBy: 'user' })
  lateShadowEnforced() {
    return { ok: true };
  }

  @Get('late-shadow')
  @RateLimit({ capacity: 10, refillPerSecond: SLOW, name: 'ls-s', enforce: false })
  @RateLimit({ capacity: 2, refillPerSecond: SLOW, name: 'ls-s-user', keyBy: 'user', enforce: false })
  lateShadow() {
    return { ok: true };
  }

  /**
   * The stricter policy by IP (2, phase 1) in shadow, refusing: the policy by user (10, phase 2) is shadow
   * too. Enforced, a request refused in phase 1 never reaches phase 2, so the shadow policy of phase 2
   * must not drain either.
   */
  @Get('early-shadow-enforced')
  @RateLimit({ capacity: 2, refillPerSecond: SLOW, name: 'es-e' })
  @RateLimit({ capacity: 10, refillPerSecond: SLOW, name: 'es-e-user', keyBy: 'user' })
  earlyShadowEnforced() {
    return { ok: true };
  }

  @Get('early-shadow')
  @RateLimit({ capacity: 2, refillPerSecond: SLOW, name: 'es-s', enforce: false })
  @RateLimit({ capacity: 10, refillPerSecond: SLOW, name: 'es-s-user', keyBy: 'user', enforce: false })
  earlyShadow() {
    return { ok: true };
  }

  /** Refunds: 5 tokens, given back when the handler fails. */
  @Get('refund-enforced')
  @RateLimit({ capacity: 5, refillPerSecond: SLOW, name: 'rf-e', refundOn: 'failure' })
  refundEnforced(@Query('fail') failed?: string) {
    return fail(failed);
  }

  @Get('refund-shadow')
  @RateLimit({ capacity: 5, refillPerSecond: SLOW, name: 'rf-s', refundOn: 'failure', enforce: false })
  refundShadow(@Query('fail') failed?: string) {
    return fail(failed);
  }
}

export function twinAppModule(options: RateLimitModuleOptions) {
  @Module({ imports: [RateLimitModule.forRoot(options)], controllers: [TwinController] })
  class TwinAppModule {}
  return TwinAppModule;
}
