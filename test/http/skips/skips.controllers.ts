import { type CanActivate, Controller, type ExecutionContext, Get, Injectable, Module, UseGuards } from '@nestjs/common';
import { RateLimit, RateLimitModule, type RateLimitModuleOptions, SkipRateLimit } from 'nest-redis-rate-limit';

/** Never refills within a test: a bucket's tokens only change by what the test does. */
export const SLOW = 0.001;

/** The signed-in user: `x-user` names it (a stand-in for an auth guard, which runs after RateLimitGuard). */
@Injectable()
export class FakeAuthGuard implements CanActivate {
  canActivate(context: ExecutionContext): boolean {
    const request = context.switchToHttp().getRequest();
    const id = request.headers['x-user'];
    if (typeof id === 'string') request.user = { id };
    return true;
  }
}

/** What a policy `skipIf` answers, from the `x-skip-a` header: '1' skips, 'throw' throws, 'hang' never answers. */
function skipA(context: ExecutionContext): boolean | Promise<boolean> {
  const value = context.switchToHttp().getRequest().headers['x-skip-a'];
  if (value === 'throw') throw new Error('skipIf of policy a failed');
  if (value === 'hang') return new Promise<boolean>(() => undefined);
  return value === '1';
}

@Controller('s')
export class SkipsController {
  /** One per-IP policy, decided by the guard alone. */
  @Get('ip')
  @RateLimit({ capacity: 2, refillPerSecond: SLOW, name: 'ip2' })
  ip() {
    return { ok: true };
  }

  /** A per-IP policy before the app's guards, a per-user one after them. */
  @Get('two-phase')
  @UseGuards(FakeAuthGuard)
  @RateLimit({ capacity: 3, refillPerSecond: SLOW, name: 'tp-ip' })
  @RateLimit({ capacity: 2, refillPerSecond: SLOW, keyBy: 'user', name: 'tp-user' })
  twoPhase() {
    return { ok: true };
  }

  /** Policy a has a skipIf; policy b has none. */
  @Get('policy-skip')
  @RateLimit({ capacity: 2, refillPerSecond: SLOW, name: 'ps-a', skipIf: skipA })
  @RateLimit({ capacity: 3, refillPerSecond: SLOW, name: 'ps-b' })
  policySkip() {
    return { ok: true };
  }

  /** An API-key policy and a per-IP policy. */
  @Get('key')
  @RateLimit({ capacity: 2, refillPerSecond: SLOW, keyBy: 'apiKey', name: 'key2' })
  @RateLimit({ capacity: 3, refillPerSecond: SLOW, name: 'key-ip' })
  key() {
    return { ok: true };
  }

  /** Two named policies, one of them skipped by name on the handler. */
  @Get('named')
  @RateLimit({ capacity: 2, refillPerSecond: SLOW, name: 'burst' })
  @RateLimit({ capacity: 3, refillPerSecond: SLOW, name: 'quota' })
  @SkipRateLimit('burst')
  named() {
    return { ok: true };
  }

  /** Both named policies skipped by name: nothing left to decide. */
  @Get('named-both')
  @RateLimit({ capacity: 2, refillPerSecond: SLOW, name: 'burst' })
  @RateLimit({ capacity: 3, refillPerSecond: SLOW, name: 'quota' })
  @SkipRateLimit('burst', 'quota')
  namedBoth() {
    return { ok: true };
  }
}

/** No policy of its own: the module defaults apply (`d-burst` and `d-quota`), one of them skipped by name. */
@Controller('d')
export class DefaultsSkipController {
  @Get()
  @SkipRateLimit('d-burst')
  defaults() {
    return { ok: true };
  }
}

/** Named skip on the controller: every handler loses its `burst` policy. */
@Controller('c')
@RateLimit({ capacity: 2, refillPerSecond: SLOW, name: 'burst' })
@RateLimit({ capacity: 3, refillPerSecond: SLOW, name: 'quota' })
@SkipRateLimit('burst')
export class NamedSkipController {
  @Get('plain')
  plain() {
    return { ok: true };
  }

  /** Its own policies (replacing the controller's), one of them named `burst`: still skipped. */
  @Get('own')
  @RateLimit({ capacity: 4, refillPerSecond: SLOW, name: 'burst' })
  @RateLimit({ capacity: 5, refillPerSecond: SLOW, name: 'own' })
  own() {
    return { ok: true };
  }

  /** Skips everything, whatever the controller says. */
  @Get('all')
  @SkipRateLimit()
  all() {
    return { ok: true };
  }
}

/** Whole-controller skip, undone on one handler. */
@Controller('off')
@RateLimit({ capacity: 2, refillPerSecond: SLOW, name: 'off' })
@SkipRateLimit()
export class SkippedController {
  @Get('skipped')
  skipped() {
    return { ok: true };
  }

  @Get('undone')
  @SkipRateLimit(false)
  undone() {
    return { ok: true };
  }
}

/** Named skip on the controller, undone with `@SkipRateLimit(false)` on one handler. */
@Controller('undo-named')
@RateLimit({ capacity: 2, refillPerSecond: SLOW, name: 'burst' })
@RateLimit({ capacity: 3, refillPerSecond: SLOW, name: 'quota' })
@SkipRateLimit('burst')
export class UndoNamedSkipController {
  @Get()
  @SkipRateLimit(false)
  undone() {
    return { ok: true };
  }
}

/** A name no policy of the handler has: the application must not start. */
@Controller('bad')
export class BadSkipController {
  @Get()
  @RateLimit({ capacity: 2, refillPerSecond: SLOW, name: 'burst' })
  @SkipRateLimit('nope')
  typo() {
    return { ok: true };
  }
}

/** A controller-level name that none of its handlers' policies has (`brust`): the application must not start either. */
@Controller('bad-class')
@RateLimit({ capacity: 2, refillPerSecond: SLOW, name: 'burst' })
@RateLimit({ capacity: 3, refillPerSecond: SLOW, name: 'quota' })
@SkipRateLimit('brust')
export class BadClassSkipController {
  @Get('a')
  a() {
    return { ok: true };
  }

  /** Its own policies: `brust` is not among them either. */
  @Get('b')
  @RateLimit({ capacity: 4, refillPerSecond: SLOW, name: 'own' })
  b() {
    return { ok: true };
  }
}

export const SKIP_CONTROLLERS = [SkipsController, NamedSkipController, SkippedController];

/** The test app: `RateLimitModule.forRoot(options)` and `controllers`. */
export function skipsAppModule(options: RateLimitModuleOptions, controllers: Function[] = SKIP_CONTROLLERS) {
  @Module({ imports: [RateLimitModule.forRoot(options)], controllers: controllers as any[] })
  class SkipsAppModule {}
  return SkipsAppModule;
}
