import {
  type CanActivate,
  Controller,
  type DynamicModule,
  type ExecutionContext,
  Get,
  Injectable,
  Module,
  UseGuards,
} from '@nestjs/common';
import {
  RateLimit,
  RateLimitModule,
  type RateLimitIdentity,
  type RateLimitModuleOptions,
  type RateLimitResolver,
  type ResolvedLimits,
} from 'nest-redis-rate-limit';

/** The signed-in user: `x-user` names it, `x-plan` its plan (a stand-in for an auth guard). */
@Injectable()
export class FakeAuthGuard implements CanActivate {
  canActivate(context: ExecutionContext): boolean {
    const request = context.switchToHttp().getRequest();
    const id = request.headers['x-user'];
    if (typeof id === 'string') request.user = { id, plan: request.headers['x-plan'] ?? 'free' };
    return true;
  }
}

/** Plans by user, changeable by the test: what a repository would hold. */
@Injectable()
export class PlanStore {
  readonly plans = new Map<string, ResolvedLimits>();
  lookups = 0;
  limitsFor(user: string): ResolvedLimits {
    this.lookups++;
    return this.plans.get(user) ?? { capacity: 2, refillPerSecond: 0.001 };
  }
}

/** A resolver with an injected dependency, as the README shows. */
@Injectable()
export class PlanLimits implements RateLimitResolver {
  readonly seen: RateLimitIdentity[] = [];
  constructor(private readonly store: PlanStore) {}
  resolve(identity: RateLimitIdentity): ResolvedLimits {
    this.seen.push(identity);
    return this.store.limitsFor(identity.value);
  }
}

@Injectable()
export class ThrowingLimits implements RateLimitResolver {
  resolve(): ResolvedLimits {
    throw new Error('plan service down');
  }
}

@Injectable()
export class HangingLimits implements RateLimitResolver {
  resolve(): Promise<ResolvedLimits> {
    return new Promise(() => undefined);
  }
}

@Injectable()
export class InvalidLimits implements RateLimitResolver {
  resolve(): ResolvedLimits {
    return { capacity: 2.5, refillPerSecond: 1 };
  }
}

const planOf = (context: ExecutionContext): string => context.switchToHttp().getRequest().user?.plan ?? 'free';
const queryNumber = (name: string) => (context: ExecutionContext) => Number(context.switchToHttp().getRequest().query[name]);

@Controller('dyn')
@UseGuards(FakeAuthGuard)
export class PerRequestController {
  /** Capacity from the user's plan: pro 5, free 2. */
  @Get('plan')
  @RateLimit({ capacity: (c) => (planOf(c) === 'pro' ? 5 : 2), refillPerSecond: 0.001, keyBy: 'user' })
  plan() {
    return { ok: true };
  }

  /** Cost from the request (?n=), async. */
  @Get('cost')
  @RateLimit({ capacity: 10, refillPerSecond: 0.001, cost: async (c) => queryNumber('n')(c) })
  cost() {
    return { ok: true };
  }

  /** Numbers from the query, no fallback: an invalid one is a 500. */
  @Get('query')
  @RateLimit({ capacity: queryNumber('capacity'), refillPerSecond: 0.001 })
  query() {
    return { ok: true };
  }

  @Get('resolved')
  @RateLimit({ resolve: PlanLimits, keyBy: 'user' })
  resolved() {
    return { ok: true };
  }

  @Get('throwing')
  @RateLimit({ resolve: ThrowingLimits, capacity: 1, refillPerSecond: 0.001 })
  throwing() {
    return { ok: true };
  }

  @Get('hanging')
  @RateLimit({ resolve: HangingLimits, capacity: 1, refillPerSecond: 0.001 })
  hanging() {
    return { ok: true };
  }

  @Get('invalid')
  @RateLimit({ resolve: InvalidLimits })
  invalid() {
    return { ok: true };
  }
}

export function perRequestAppModule(options: RateLimitModuleOptions): DynamicModule {
  @Module({
    imports: [RateLimitModule.forRoot(options)],
    controllers: [PerRequestController],
    providers: [PlanStore, PlanLimits],
  })
  class PerRequestAppModule {}
  return { module: PerRequestAppModule };
}
