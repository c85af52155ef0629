import { type ExecutionContext, InternalServerErrorException, type Type } from '@nestjs/common';
import type { ModuleRef } from '@nestjs/core';
import type { Deadlines } from '../bucket/with-timeout.js';
import { assertBlockSeconds, assertBucketPolicy, assertCost, type CompiledPolicy } from '../policies/policy.js';
import { RESOLVER_CACHE_MAX_ENTRIES } from '../rate-limit.constants.js';
import type { RateLimitIdentity, RateLimitResolver, ResolvedLimits } from '../rate-limit.interfaces.js';

/** The numbers of one request's bucket. */
export interface RequestNumbers {
  capacity: number;
  refillPerSecond: number;
  cost: number;
}

interface CachedLimits {
  expires: number;
  limits: Promise<ResolvedLimits>;
}

/**
 * Per-request numbers of dynamic policies: functions of the request, or a `RateLimitResolver` per
 * identity (cached for `resolverCacheMs`, at most `RESOLVER_CACHE_MAX_ENTRIES` identities, oldest first
 * out). Every answer is bounded by `timeoutMs` and checked like a static policy. A policy whose numbers
 * cannot be had (a hook throws, hangs or answers invalid numbers) uses its static fallback when it has
 * one, else the request is refused with 500: a limit nobody can compute is a bug to see, never a silent
 * pass. Either way it is logged once per route and policy.
 */
export class PolicyNumbers {
  private readonly resolvers = new Map<Type<RateLimitResolver>, Promise<RateLimitResolver>>();
  private readonly cache = new Map<string, CachedLimits>();

  constructor(
    private readonly moduleRef: ModuleRef,
    private readonly deadlines: Deadlines,
    private readonly cacheMs: number,
    private readonly once: (key: string, message: string) => void,
    private readonly clock: () => number = Date.now,
  ) {}

  /**
   * The resolver instance of a class: the app's provider when one is registered anywhere, else one
   * instance created with its dependencies injected. Start-up calls it for every route, so a resolver
   * Nest cannot build stops the application with the route's name.
   */
  resolver(type: Type<RateLimitResolver>, route: string): Promise<RateLimitResolver> {
    let instance = this.resolvers.get(type);
    if (instance === undefined) {
      instance = this.instantiate(type).catch((error: unknown) => {
        this.resolvers.delete(type);
        throw new Error(
          `@RateLimit resolve: ${type.name} on ${route} could not be created (${error instanceof Error ? error.message : String(error)}): ` +
            'register it as a provider, or make sure its dependencies can be injected',
        );
      });
      this.resolvers.set(type, instance);
    }
    return instance;
  }

  async numbersOf(context: ExecutionContext, route: string, policy: CompiledPolicy, who: RateLimitIdentity): Promise<RequestNumbers> {
    const dynamic = policy.dynamic!;
    const where = policy.scope === route ? route : `${route} (${policy.scope})`;
    try {
      let capacity: unknown;
      let refillPerSecond: unknown;
      let cost: unknown;
      if (dynamic.resolve !== undefined) {
        const limits = await this.resolved(dynamic.resolve, route, policy.scope, who, context);
        if (typeof limits !== 'object' || limits === null) throw new Error(`the resolver answered ${String(limits)}`);
        capacity = limits.capacity;
        refillPerSecond = limits.refillPerSecond;
        cost = dynamic.cost !== undefined ? await this.bounded(dynamic.cost(context)) : (limits.cost ?? dynamic.fallback?.cost ?? 1);
      } else {
        [capacity, refillPerSecond, cost] = await Promise.all([
          this.bounded(dynamic.capacity!(context)),
          this.bounded(dynamic.refillPerSecond!(context)),
          this.bounded(dynamic.cost!(context)),
        ]);
      }
      const numbers = { capacity, refillPerSecond } as RequestNumbers;
      assertBucketPolicy(numbers, where);
      assertCost(cost, numbers.capacity, where);
      if (policy.blockSeconds > 0) assertBlockSeconds(policy.blockSeconds, numbers, false, where);
      numbers.cost = cost as number;
      return numbers;
    } catch (error) {
      const reason = error instanceof Error ? error.message : String(error);
      const fallback = dynamic.fallback;
      this.once(
        `numbers|${route}|${policy.scope}`,
        `The limits of ${where} could not be computed for a request (${reason}): ` +
          (fallback
            ? `using its fallback ${fallback.capacity} per ${fallback.capacity / fallback.refillPerSecond} s. Logged once`
            : 'the request is refused with 500. Give the policy capacity and refillPerSecond as a fallback to limit such requests instead. Logged once'),
      );
      if (fallback) return fallback;
      throw new InternalServerErrorException('The rate limit of this route could not be computed');
    }
  }

  private resolved(
    type: Type<RateLimitResolver>,
    route: string,
    scope: string,
    who: RateLimitIdentity,
    context: ExecutionContext,
  ): Promise<ResolvedLimits> {
    const key = `${scope}\u0000${who.kind}\u0000${who.value}`;
    const now = this.clock();
    const cached = this.cache.get(key);
    if (cached !== undefined && cached.expires > now) return cached.limits;
    const limits = this.resolver(type, route).then((resolver) => this.bounded(resolver.resolve({ kind: who.kind, value: who.value }, context)));
    if (this.cacheMs > 0) {
      if (cached !== undefined) this.cache.delete(key);
      else if (this.cache.size >= RESOLVER_CACHE_MAX_ENTRIES) this.cache.delete(this.cache.keys().next().value as string);
      const entry = { expires: now + this.cacheMs, limits };
      this.cache.set(key, entry);
      // A failed lookup is not remembered: the next request asks again.
      limits.catch(() => {
        if (this.cache.get(key) === entry) this.cache.delete(key);
      });
    }
    return limits;
  }

  /** Resolver answers cached now (for tests and the note on memory). */
  get cached(): number {
    return this.cache.size;
  }

  private async instantiate(type: Type<RateLimitResolver>): Promise<RateLimitResolver> {
    try {
      return this.moduleRef.get(type, { strict: false });
    } catch {
      return this.moduleRef.create(type);
    }
  }

  private bounded<T>(answer: T | PromiseLike<T>): Promise<T> {
    return typeof (answer as PromiseLike<T> | null)?.then === 'function'
      ? this.deadlines.race(Promise.resolve(answer))
      : Promise.resolve(answer as T);
  }
}
