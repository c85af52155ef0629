import { Inject, Injectable } from '@nestjs/common';
import { assertCost, assertServicePolicy } from '../bucket/bucket-policy.check.js';
import { RouteBuckets } from '../bucket/route-buckets.js';
import {
  createDigest,
  type Digest,
  type RouteIdentity,
  type RouteIdentityKind,
  routeIdentity,
  routeIdentityKind,
  routeKey,
} from '../keys/identity-keys.js';
import type { BucketPolicy } from '../rate-limit.interfaces.js';
import { RATE_LIMIT_OPTIONS } from '../rate-limit.module-definition.js';
import type { ResolvedRateLimitOptions } from '../rate-limit.options.js';
import type { BucketRequest } from '../stores/token-bucket.js';
import type { CompiledPolicy } from './policy.js';
import { PolicyRegistry } from './policy-registry.js';
import { RateLimitConfigError } from '../errors/rate-limit.errors.js';

/** The route policies' buckets by scope, from the routes `PolicyRegistry` found: what `BucketService.peekRoute()` / `resetRoute()` ask. */
@Injectable()
export class PolicyRouteBuckets extends RouteBuckets {
  private readonly hash: Digest;

  constructor(
    private readonly registry: PolicyRegistry,
    @Inject(RATE_LIMIT_OPTIONS) private readonly options: ResolvedRateLimitOptions,
  ) {
    super();
    this.hash = createDigest(options.secret);
  }

  peekRequest(scope: string, who: RouteIdentity, policy: (BucketPolicy & { cost?: number }) | undefined, where: string): BucketRequest {
    const policies = this.routePolicies(scope, who, where);
    const numbers = policy ?? sharedNumbers(policies, scope, where);
    assertServicePolicy(numbers, where, ['cost']);
    const cost = policy?.cost ?? sharedCost(policies);
    assertCost(cost, numbers.capacity, where, 'BucketService');
    const request: BucketRequest = {
      key: routeKey(this.options.keyPrefix, routeIdentity(who, this.hash), policies[0].keySuffix),
      capacity: numbers.capacity,
      refillPerSecond: numbers.refillPerSecond,
      cost,
    };
    // A bucket under a penalty holds tokens below 0: the store reads them as such only when told the penalty.
    const blockSeconds = Math.max(...policies.map((p) => p.blockSeconds));
    if (blockSeconds > 0) request.blockSeconds = blockSeconds;
    return request;
  }

  keyOf(scope: string, who: RouteIdentity, where: string): string {
    const policies = this.routePolicies(scope, who, where);
    return routeKey(this.options.keyPrefix, routeIdentity(who, this.hash), policies[0].keySuffix);
  }

  /**
   * The compiled route policies of `scope`, after checking that one of them can key a bucket
   * by its kind (every policy falls back to the IP, so `{ ip }` always can).
   */
  private routePolicies(scope: string, who: RouteIdentity, where: string): CompiledPolicy[] {
    const byScope = new Map<string, CompiledPolicy[]>();
    for (const { plan } of this.registry.routes()) {
      for (const policy of plan?.policies ?? []) byScope.set(policy.scope, [...(byScope.get(policy.scope) ?? []), policy]);
    }
    const policies = typeof scope === 'string' ? byScope.get(scope) : undefined;
    if (policies === undefined) {
      const known = [...byScope.keys()].sort().map((s) => JSON.stringify(s));
      throw new RateLimitConfigError(
        'ERR_RATE_LIMIT_UNKNOWN_SCOPE',
        `${where}: no route policy has the scope ${typeof scope === 'string' ? JSON.stringify(scope) : String(scope)} ` +
          `(a policy's name, or Controller.handler for an unnamed one); ` +
          (known.length === 0 ? 'no route has a @RateLimit policy' : `known scopes: ${known.join(', ')}`),
      );
    }
    const kind = routeIdentityKind(who);
    const kinds = new Set<RouteIdentityKind>(['ip', ...policies.map(identityKindOf)]);
    if (!kinds.has(kind)) {
      throw new RateLimitConfigError(
        'ERR_RATE_LIMIT_INVALID_IDENTITY',
        `${where}: the policies of scope ${JSON.stringify(scope)} key buckets by ${[...kinds].join(' or ')}, ` +
          `never by ${kind}: that bucket does not exist`,
      );
    }
    return policies;
  }
}

/** The identity kind a policy's own keyBy gives (its fallback, the IP, aside). */
function identityKindOf(policy: CompiledPolicy): RouteIdentityKind {
  return typeof policy.keyBy === 'function' ? 'id' : policy.keyBy;
}

/** The numbers every policy of a scope has, or an error asking for them. */
function sharedNumbers(policies: readonly CompiledPolicy[], scope: string, where: string): BucketPolicy {
  const ask = `pass them: peekRoute(${JSON.stringify(scope)}, who, { capacity, refillPerSecond })`;
  if (policies.some((p) => p.dynamic !== undefined)) {
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_ROUTE_NUMBERS_REQUIRED',
      `${where}: the numbers of this policy are computed per request (functions or resolve); ${ask}`,
    );
  }
  const [first] = policies;
  const differ = policies.some((p) => p.capacity !== first.capacity || p.refillPerSecond !== first.refillPerSecond);
  if (differ) {
    const seen = [...new Set(policies.map((p) => `capacity ${p.capacity}, refillPerSecond ${p.refillPerSecond}`))];
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_ROUTE_NUMBERS_REQUIRED',
      `${where}: the routes that share this policy name have different numbers (${seen.join('; ')}); ${ask}`,
    );
  }
  return { capacity: first.capacity, refillPerSecond: first.refillPerSecond };
}

/** The cost of a request of a scope's policies, or 1 when they differ or one is computed per request. */
function sharedCost(policies: readonly CompiledPolicy[]): number {
  if (policies.some((p) => p.dynamic !== undefined)) return 1;
  return policies.every((p) => p.cost === policies[0].cost) ? policies[0].cost : 1;
}
