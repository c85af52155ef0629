import type { ModuleRef } from '@nestjs/core';
import type { RoutePlan } from '../policies/policy-registry.js';
import { RATE_LIMIT_POLICIES } from '../rate-limit.constants.js';

/** @nestjs/graphql's options token and field-resolver metadata, read by name: the library does not depend on it. */
const GRAPHQL_MODULE_OPTIONS = 'GqlModuleOptions';
const FIELD_RESOLVER = 'graphql:resolve_property';

/** What the start-up check of field resolvers found: policies nothing would enforce (`refused`), and notes. */
export interface FieldResolverFindings {
  /** One line per field resolver whose own policy, or whose policies decided after the guards, would never be decided. */
  refused: string[];
  warnings: string[];
}

/**
 * Nest runs on a field resolver (`@ResolveField`) only the enhancers named in GraphQLModule's
 * `fieldResolverEnhancers`. With 'interceptors', `RateLimitInterceptor` decides every policy there (after
 * `RateLimitGuard` when 'guards' is there too, else both phases itself). Without it:
 * - with 'guards' alone, the guard decides the policies of phase 1, and those decided after the app's
 *   guards (user, verified API key, keyBy functions, per-request numbers) never are: a field would be
 *   limited by some of its policies only (a keyBy function's policy of 3 let 20 of 20 through), so
 *   such a field resolver is refused at start-up, whatever its policies come from;
 * - with neither, nothing runs: a `@RateLimit` written on the field resolver is refused at start-up;
 *   policies it only inherits (its class's, the module's `defaults`) are meant for the queries and
 *   mutations beside it, where they are enforced: a warning says they skip the field.
 * None when the app has no GraphQL module.
 */
export function checkFieldResolvers(
  moduleRef: ModuleRef,
  routes: Iterable<{ handler: Function; plan: RoutePlan | null }>,
): FieldResolverFindings {
  const findings: FieldResolverFindings = { refused: [], warnings: [] };
  let options: { fieldResolverEnhancers?: unknown } | undefined;
  try {
    options = moduleRef.get(GRAPHQL_MODULE_OPTIONS, { strict: false });
  } catch {
    return findings;
  }
  const set = options?.fieldResolverEnhancers;
  const enhancers: unknown[] = Array.isArray(set) ? set : [];
  if (enhancers.includes('interceptors')) return findings;
  const guards = enhancers.includes('guards');
  const named = set === undefined ? '(not set)' : `[${enhancers.map((e) => `'${String(e)}'`).join(', ')}]`;
  for (const { handler, plan } of routes) {
    if (plan === null || !Reflect.hasMetadata(FIELD_RESOLVER, handler)) continue;
    if (plan.concurrency !== undefined) {
      // The slot is taken and given back by RateLimitInterceptor alone: without it, no limit at all.
      findings.refused.push(
        `@ConcurrencyLimit on ${plan.route} (a GraphQL field resolver) would never be enforced: GraphQLModule's ` +
          `fieldResolverEnhancers ${named} runs no interceptor on field resolvers. Add 'interceptors' to ` +
          'fieldResolverEnhancers, or put @SkipRateLimit() on the field resolver',
      );
      continue;
    }
    const own = Reflect.getOwnMetadata(RATE_LIMIT_POLICIES, handler) !== undefined;
    const where = `@RateLimit on ${plan.route} (a GraphQL field resolver)`;
    if (guards) {
      if (plan.afterGuards.length === 0) continue;
      const one = plan.afterGuards.length === 1;
      const policies = plan.afterGuards.map((p) => p.scope).join(', ');
      findings.refused.push(
        `${where} would be enforced only in part: its ${one ? 'policy' : 'policies'} ${policies} ${one ? 'is' : 'are'} decided after ` +
          `your guards, by RateLimitInterceptor, and GraphQLModule's fieldResolverEnhancers ${named} runs no interceptor on field ` +
          "resolvers. Add 'interceptors' to fieldResolverEnhancers, or put @SkipRateLimit() on the field resolver",
      );
    } else if (own) {
      findings.refused.push(
        `${where} would never be enforced: GraphQLModule's fieldResolverEnhancers ${named} runs no guard and no interceptor on ` +
          "field resolvers. Add 'guards' and 'interceptors' to fieldResolverEnhancers, or remove the @RateLimit",
      );
    } else {
      findings.warnings.push(
        `${where} is not enforced: the policies it takes from its class or the module's defaults apply to queries and mutations, ` +
          `and GraphQLModule's fieldResolverEnhancers ${named} runs no guard and no interceptor on field resolvers. ` +
          "Add 'guards' and 'interceptors' to fieldResolverEnhancers to limit the field too, or put @SkipRateLimit() on it",
      );
    }
  }
  return findings;
}
