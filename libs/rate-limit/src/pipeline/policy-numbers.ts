import { BadRequestException, type ExecutionContext, InternalServerErrorException, type Type } from '@nestjs/common';
import type { ModuleRef } from '@nestjs/core';
import type { Deadlines } from '../engine/with-timeout.js';
import { assertBucketPolicy, assertCost } from '../bucket/bucket-policy.check.js';
import { assertBlockSeconds, type CompiledPolicy } from '../policies/policy.js';
import { RESOLVER_CACHE_MAX_ENTRIES } from '../rate-limit.constants.js';
import type { RateLimitIdentity, RateLimitResolver, ResolvedLimits } from '../rate-limit.interfaces.js';
import { RateLimitConfigError, reasonOf } from '../errors/rate-limit.errors.js';

/** The numbers of one request's bucket. */
export interface RequestNumbers {
  capacity: number;
  refillPerSecond: number;
  cost: number;
}

/** The identity a resolver is asked about, with `id`: its part of the bucket key (`routeIdentity`), bounded. */
export interface CacheableIdentity extends RateLimitIdentity {
  id: string;
}

interface CachedLimits {
  expires: number;
  limits: Promise<ResolvedLimits>;
}

/**
 * Per-request numbers of dynamic policies: functions of the request, or a `RateLimitResolver` per
 * identity (cached for `resolverCacheMs` under the identity's bounded key part, at most
 * `RESOLVER_CACHE_MAX_ENTRIES` identities, oldest first out, expired ones dropped as time passes). Every
 * answer is bounded by `timeoutMs` and checked like a static policy. A policy whose numbers
 * cannot be had (a hook throws, hangs or answers invalid numbers) uses its static fallback when it has
 * one, else the request is refused with 500: a limit nobody can compute is a bug to see, never a silent
 * pass. A cost function of the request that answers an invalid cost is the client's input: 400. Either
 * way it is logged once per route and policy.
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
        throw new RateLimitConfigError(
          'ERR_RATE_LIMIT_RESOLVER_NOT_INJECTABLE',
          `@RateLimit resolve: ${type.name} on ${route} could not be created (${error instanceof Error ? error.message : String(error)}): ` +
            'register it as a provider, or make sure its dependencies can be injected',
        );
      });
      this.resolvers.set(type, instance);
    }
    return instance;
  }

  async numbersOf(context: ExecutionContext, route: string, policy: CompiledPolicy, who: CacheableIdentity): Promise<RequestNumbers> {
    const dynamic = policy.dynamic!;
    const where = policy.scope === route ? route : `${route} (${policy.scope})`;
    let numbers: RequestNumbers;
    let cost: unknown;
    try {
      let capacity: unknown;
      let refillPerSecond: unknown;
      if (dynamic.resolve !== undefined) {
        const limits = await this.resolved(dynamic.resolve, route, policy.scope, who, context);
        if (typeof limits !== 'object' || limits === null)
          throw new RateLimitConfigError('ERR_RATE_LIMIT_INVALID_POLICY', `the resolver answered ${String(limits)}`);
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
      numbers = { capacity, refillPerSecond } as RequestNumbers;
      assertBucketPolicy(numbers, where);
      if (!dynamic.costFromRequest) assertCost(cost, numbers.capacity, where);
      if (policy.blockSeconds > 0) assertBlockSeconds(policy.blockSeconds, numbers, false, where);
    } catch (error) {
      const reason = reasonOf(error);
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
    numbers.cost = dynamic.costFromRequest ? this.requestCost(cost, numbers.capacity, route, where) : (cost as number);
    return numbers;
  }

  /**
   * The answer of a cost function of the request. One that is not an integer from 1 to the capacity
   * comes from what the client sent (an empty list, a fraction, a negative or huge count): a 400 that
   * says why, never a 500 nor a fallback, and logged once so that the route's developer can clamp it.
   */
  private requestCost(cost: unknown, capacity: number, route: string, where: string): number {
    if (typeof cost === 'number' && Number.isInteger(cost) && cost >= 1 && cost <= capacity) return cost;
    // A number is shown as it is; anything else only by its type: a client's string is never echoed.
    const got = typeof cost === 'number' ? String(cost) : cost === null ? 'null' : typeof cost;
    this.once(
      `cost|${route}|${where}`,
      `The cost function of ${where} answered ${got} for a request, not an integer from 1 to capacity ${capacity}: ` +
        'the request is refused with 400. Clamp what comes from the client, e.g. Math.min(capacity, Math.max(1, n)). Logged once',
    );
    throw new BadRequestException(`The rate-limit cost of this request must be an integer from 1 to ${capacity} (got ${got})`);
  }

  private resolved(
    type: Type<RateLimitResolver>,
    route: string,
    scope: string,
    who: CacheableIdentity,
    context: ExecutionContext,
  ): Promise<ResolvedLimits> {
    // The bucket key's identity: bounded (a long or unusual value is a digest), so no client can make an
    // entry large, and the raw value is never kept.
    const key = `${scope}\u0000${who.id}`;
    const now = this.clock();
    this.dropExpired(now);
    const cached = this.cache.get(key);
    if (cached !== undefined && cached.expires > now) return cached.limits;
    const { kind, value } = who;
    const limits = this.resolver(type, route).then((resolver) => this.bounded(resolver.resolve({ kind, value }, context)));
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

  /**
   * Every entry lives `cacheMs` and a renewed one moves to the end, so the map is in order of expiry:
   * the expired ones are at its head. Dropping them there costs one look per request, plus one per
   * entry dropped, never a walk over the whole map.
   */
  private dropExpired(now: number): void {
    for (const [key, entry] of this.cache) {
      if (entry.expires > now) return;
      this.cache.delete(key);
    }
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
