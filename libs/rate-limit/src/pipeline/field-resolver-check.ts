import type { ModuleRef } from '@nestjs/core';
import type { RoutePlan } from '../policies/policy-registry.js';

/** @nestjs/graphql's options token and field-resolver metadata, read by name: the library does not depend on it. */
const GRAPHQL_MODULE_OPTIONS = 'GqlModuleOptions';
const FIELD_RESOLVER = 'graphql:resolve_property';

/**
 * Nest runs on a field resolver (`@ResolveField`) only the enhancers named in GraphQLModule's
 * `fieldResolverEnhancers`: without 'guards' no policy is decided there, without 'interceptors' none
 * of those decided after the app's guards (by `RateLimitInterceptor`). Answers one warning per such
 * field resolver; none when the app has no GraphQL module.
 */
export function fieldResolverWarnings(moduleRef: ModuleRef, routes: Iterable<{ handler: Function; plan: RoutePlan | null }>): string[] {
  let options: { fieldResolverEnhancers?: unknown } | undefined;
  try {
    options = moduleRef.get(GRAPHQL_MODULE_OPTIONS, { strict: false });
  } catch {
    return [];
  }
  const set = options?.fieldResolverEnhancers;
  const enhancers: unknown[] = Array.isArray(set) ? set : [];
  const guards = enhancers.includes('guards');
  const interceptors = enhancers.includes('interceptors');
  if (guards && interceptors) return [];
  const named = set === undefined ? '(not set)' : `[${enhancers.map((e) => `'${String(e)}'`).join(', ')}]`;
  const warnings: string[] = [];
  for (const { handler, plan } of routes) {
    if (plan === null || !Reflect.hasMetadata(FIELD_RESOLVER, handler)) continue;
    const where = `@RateLimit on ${plan.route} (a GraphQL field resolver) is not enforced`;
    if (!guards) {
      warnings.push(
        `${where}: GraphQLModule's fieldResolverEnhancers ${named} runs no guard and no interceptor on field resolvers. ` +
          "Add 'guards' and 'interceptors' to fieldResolverEnhancers",
      );
    } else if (plan.afterGuards.length > 0) {
      const policies = plan.afterGuards.map((p) => p.scope).join(', ');
      warnings.push(
        `${where}: its ${plan.afterGuards.length === 1 ? 'policy' : 'policies'} ${policies} ${plan.afterGuards.length === 1 ? 'is' : 'are'} ` +
          `decided after your guards, by RateLimitInterceptor, and GraphQLModule's fieldResolverEnhancers ${named} runs no ` +
          "interceptor on field resolvers. Add 'interceptors' to fieldResolverEnhancers",
      );
    }
  }
  return warnings;
}
