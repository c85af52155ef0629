import { type CanActivate, type ExecutionContext, Injectable } from '@nestjs/common';
import type { RateLimitIdentity, RateLimitResolver, ResolvedLimits } from 'nest-redis-rate-limit';

export type Plan = 'free' | 'pro';

/** A stand-in for the app's user table: who is on which plan. */
@Injectable()
export class DemoUsers {
  private readonly plans = new Map<string, Plan>([
    ['ann', 'pro'],
    ['bob', 'free'],
  ]);

  planOf(user: string): Plan | undefined {
    return this.plans.get(user);
  }
}

/** A stand-in for an auth guard: `x-user: ann` signs in as ann, if ann exists. */
@Injectable()
export class DemoUserGuard implements CanActivate {
  constructor(private readonly users: DemoUsers) {}

  canActivate(context: ExecutionContext): boolean {
    const request = context.switchToHttp().getRequest();
    const name = request.headers['x-user'];
    const plan = typeof name === 'string' ? this.users.planOf(name) : undefined;
    if (plan !== undefined) request.user = { id: name, plan };
    return true;
  }
}

/** Each plan's budget: what `@RateLimit({ resolve: PlanLimits })` gives each user. */
export const PLAN_LIMITS: Record<Plan, ResolvedLimits> = {
  pro: { capacity: 20, refillPerSecond: 2 },
  free: { capacity: 5, refillPerSecond: 0.5 },
};

/** Limits per user from the user table, through dependency injection; anonymous callers get the policy's fallback numbers by IP. */
@Injectable()
export class PlanLimits implements RateLimitResolver {
  constructor(private readonly users: DemoUsers) {}

  resolve(identity: RateLimitIdentity): ResolvedLimits {
    const plan = identity.kind === 'user' ? this.users.planOf(identity.value) : undefined;
    return PLAN_LIMITS[plan ?? 'free'];
  }
}
