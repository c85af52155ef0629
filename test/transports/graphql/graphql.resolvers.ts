import { type CanActivate, type ExecutionContext, Injectable, UseGuards } from '@nestjs/common';
import { Args, GqlExecutionContext, Int, Mutation, Query, Resolver } from '@nestjs/graphql';
import { RateLimit, SkipRateLimit } from 'nest-redis-rate-limit';

/** One token a minute: in a test of a few seconds no bucket refills a whole token. */
export const PER_MINUTE = 1 / 60;

/** The HTTP request in a resolver's GraphQL context: `req` with both drivers (Nest puts it there). */
export const httpRequestOf = (context: ExecutionContext) => GqlExecutionContext.create(context).getContext().req;

/** Signs in whoever sends `x-user`: `req.user = { id }`, as a passport guard would. */
@Injectable()
export class HeaderUserGuard implements CanActivate {
  canActivate(context: ExecutionContext): boolean {
    const req = httpRequestOf(context);
    const id = req.headers['x-user'];
    if (typeof id === 'string') req.user = { id };
    return true;
  }
}

/** Method-level policies on queries and mutations. Every field is nullable: a refused field is `null` beside the others. */
@Resolver()
export class LimitedResolver {
  private bumps = 0;

  @Query(() => String, { nullable: true })
  @RateLimit(3, PER_MINUTE)
  burst() {
    return 'burst';
  }

  @Mutation(() => Int, { nullable: true })
  @RateLimit(2, PER_MINUTE)
  bump() {
    return ++this.bumps;
  }

  @Query(() => String, { nullable: true })
  @RateLimit({ capacity: 5, refillPerSecond: PER_MINUTE, cost: 2 })
  costly() {
    return 'costly';
  }

  @Query(() => String, { nullable: true })
  @RateLimit(1, PER_MINUTE)
  pairA() {
    return 'a';
  }

  @Query(() => String, { nullable: true })
  @RateLimit(3, PER_MINUTE)
  pairB() {
    return 'b';
  }

  @Query(() => String, { nullable: true })
  @RateLimit(3, PER_MINUTE)
  aliased() {
    return 'aliased';
  }

  @Query(() => String, { nullable: true })
  @RateLimit({ capacity: 1, refillPerSecond: PER_MINUTE, refundOn: 'failure' })
  refundedOnFailure(@Args('fail', { type: () => Boolean }) fail: boolean) {
    if (fail) throw new Error('the resolver failed');
    return 'ok';
  }

  @Query(() => String, { nullable: true })
  @RateLimit({ capacity: 1, refillPerSecond: PER_MINUTE, refundOn: 'success' })
  refundedOnSuccess(@Args('fail', { type: () => Boolean }) fail: boolean) {
    if (fail) throw new Error('the resolver failed');
    return 'ok';
  }

  @Query(() => String, { nullable: true })
  unlimited() {
    return 'free';
  }
}

/** A class-level policy: every query of the class, each with its own bucket; one field skips it. */
@Resolver()
@RateLimit(2, PER_MINUTE)
export class ClassLimitedResolver {
  @Query(() => String, { nullable: true })
  classA() {
    return 'A';
  }

  @Query(() => String, { nullable: true })
  classB() {
    return 'B';
  }

  @Query(() => String, { nullable: true })
  @SkipRateLimit()
  classFree() {
    return 'free';
  }
}

/** Whose bucket: the identity comes from the HTTP request of the operation. */
@Resolver()
@UseGuards(HeaderUserGuard)
export class IdentityResolver {
  @Query(() => String, { nullable: true })
  @RateLimit(2, PER_MINUTE, 'ip')
  byIp() {
    return 'ip';
  }

  @Query(() => String, { nullable: true })
  @RateLimit(2, PER_MINUTE, 'user')
  byUser() {
    return 'user';
  }

  @Query(() => String, { nullable: true })
  @RateLimit(2, PER_MINUTE, 'apiKey')
  byApiKey() {
    return 'apiKey';
  }

  @Query(() => String, { nullable: true })
  @RateLimit(2, PER_MINUTE, (context) => httpRequestOf(context).headers['x-tenant'])
  byTenant() {
    return 'tenant';
  }
}
