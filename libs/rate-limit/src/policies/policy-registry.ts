import { Inject, Injectable, type Type } from '@nestjs/common';
import { PATH_METADATA } from '@nestjs/common/constants.js';
import { DiscoveryService, MetadataScanner } from '@nestjs/core';
import { RATE_LIMIT_POLICIES, RATE_LIMIT_SKIP } from '../rate-limit.constants.js';
import type { RateLimitPolicy } from '../rate-limit.interfaces.js';
import { RATE_LIMIT_OPTIONS } from '../rate-limit.module-definition.js';
import type { ResolvedRateLimitOptions } from '../rate-limit.options.js';
import { type CompiledPolicy, compilePolicy, type PolicyContext } from './policy.js';

/** The policies of one limited route, split by the phase that decides them. */
export interface RoutePlan {
  /** `Controller.handler`, for messages. */
  route: string;
  /** Every policy, in the order the decorators are written. */
  policies: readonly CompiledPolicy[];
  /** Decided by `RateLimitGuard`, before the app's guards. */
  beforeGuards: readonly CompiledPolicy[];
  /** Decided by `RateLimitInterceptor`, after the app's guards. */
  afterGuards: readonly CompiledPolicy[];
  /** Position in `policies` of each policy of `beforeGuards`, then of each of `afterGuards`. */
  order: readonly number[];
  /** A policy has `refundOn`: the interceptor looks at the outcome. */
  refunds: boolean;
}

function toPlan(route: string, policies: CompiledPolicy[]): RoutePlan {
  const before = policies.filter((p) => p.phase === 'before-guards');
  const after = policies.filter((p) => p.phase === 'after-guards');
  return {
    route,
    policies,
    beforeGuards: before,
    afterGuards: after,
    order: [...before, ...after].map((p) => policies.indexOf(p)),
    refunds: policies.some((p) => p.refundOn !== undefined),
  };
}

/** Metadata Nest's packages put on handlers, read by name: the library depends on none of them. */
const HANDLER_METADATA: readonly [string, HandlerKind][] = [
  [PATH_METADATA, 'http'],
  ['graphql:resolver_type', 'graphql'],
  ['graphql:resolve_property', 'graphql'],
  ['websockets:message_mapping', 'ws'],
  ['microservices:pattern', 'rpc'],
];

export type HandlerKind = 'http' | 'graphql' | 'ws' | 'rpc';

/** What kind of handler a method is: an HTTP route, a GraphQL resolver, a WebSocket or microservice handler; else undefined. */
export function handlerKind(handler: Function): HandlerKind | undefined {
  for (const [key, kind] of HANDLER_METADATA) if (Reflect.hasMetadata(key, handler)) return kind;
  return undefined;
}

/**
 * Resolves every route's policies once, at start-up: validation errors stop the application with the
 * route's name, and the guard does two map look-ups per request instead of walking metadata.
 */
@Injectable()
export class PolicyRegistry {
  private readonly plans = new Map<Function, Map<Function, RoutePlan | null>>();
  private readonly context: PolicyContext;

  constructor(
    @Inject(RATE_LIMIT_OPTIONS) private readonly options: ResolvedRateLimitOptions,
    private readonly discovery: DiscoveryService,
    private readonly scanner: MetadataScanner,
  ) {
    this.context = { apiKeyVerified: options.apiKey !== undefined, enforce: options.enforce };
  }

  /**
   * Compiles the module defaults and every route's policies, so that invalid ones stop the start; called
   * by RouteLimiter's start-up checks.
   */
  discoverRoutes(): void {
    // Checked even when no route uses them yet.
    this.compile(this.options.defaults, 'the module options', true);
    for (const wrapper of [...this.discovery.getControllers(), ...this.discovery.getProviders()]) {
      const type = wrapper.metatype as Type | null;
      if (!type || typeof type !== 'function' || !type.prototype) continue;
      for (const name of this.scanner.getAllMethodNames(type.prototype)) {
        const handler = type.prototype[name] as Function;
        if (handlerKind(handler) !== undefined) this.planFor(type, handler);
      }
    }
  }

  /** Every route start-up found, with its plan (`null`: not limited). */
  *routes(): Iterable<{ controller: Function; handler: Function; plan: RoutePlan | null }> {
    for (const [controller, byHandler] of this.plans) {
      for (const [handler, plan] of byHandler) yield { controller, handler, plan };
    }
  }

  /** The plan for a handler of a controller (`null`: not limited); computed on first use for routes start-up did not see. */
  planFor(controller: Function, handler: Function): RoutePlan | null {
    let byHandler = this.plans.get(controller);
    if (byHandler === undefined) this.plans.set(controller, (byHandler = new Map()));
    let plan = byHandler.get(handler);
    if (plan === undefined) byHandler.set(handler, (plan = this.resolve(controller, handler)));
    return plan;
  }

  private resolve(controller: Function, handler: Function): RoutePlan | null {
    const route = `${controller.name}.${handler.name}`;
    const handlerSkip: unknown = Reflect.getMetadata(RATE_LIMIT_SKIP, handler);
    const controllerSkip: unknown = Reflect.getMetadata(RATE_LIMIT_SKIP, controller);
    if (handlerSkip === true) return null;
    const policies: RateLimitPolicy[] | undefined =
      Reflect.getOwnMetadata(RATE_LIMIT_POLICIES, handler) ??
      (controllerSkip === true && handlerSkip !== false ? [] : Reflect.getMetadata(RATE_LIMIT_POLICIES, controller));
    const chosen = policies ?? this.options.defaults;
    if (chosen.length === 0) return null;
    let compiled = this.compile(chosen, route, policies === undefined);
    // @SkipRateLimit('name'): those policies are left out here. A name on the handler must exist.
    // @SkipRateLimit(false) on the handler undoes every skip of its controller, named ones included.
    const controllerNames = handlerSkip !== false && Array.isArray(controllerSkip) ? (controllerSkip as string[]) : [];
    const skipped = new Set([...(Array.isArray(handlerSkip) ? (handlerSkip as string[]) : []), ...controllerNames]);
    if (skipped.size > 0) {
      for (const name of Array.isArray(handlerSkip) ? (handlerSkip as string[]) : []) {
        if (!compiled.some((p) => p.scope === name)) {
          throw new Error(
            `@SkipRateLimit('${name}') on ${route}: no policy of that name applies there (its policies: ${compiled.map((p) => p.scope).join(', ')})`,
          );
        }
      }
      compiled = compiled.filter((p) => !skipped.has(p.scope));
      if (compiled.length === 0) return null;
    }
    return toPlan(route, compiled);
  }

  private compile(chosen: readonly RateLimitPolicy[], route: string, defaults: boolean): CompiledPolicy[] {
    // Unnamed stacked policies each need a bucket of their own: number them after the route.
    const compiled = chosen.map((policy, i) =>
      compilePolicy(
        policy,
        route,
        this.context,
        chosen.length > 1 ? `${route}#${i}` : route,
        defaults ? `RateLimitModule defaults[${i}]` : '@RateLimit',
      ),
    );
    const buckets = compiled.map((p) => `${typeof p.keyBy === 'function' ? p.keyBy.name : p.keyBy}|${p.scope}`);
    if (new Set(buckets).size !== buckets.length) {
      throw new Error(
        `@RateLimit policies stacked on ${route} share one bucket: give each a different name or keyBy`,
      );
    }
    assertSharedNamesFit(compiled, route);
    return compiled;
  }
}

/**
 * Stacked policies with one name and different keyBy meet on one bucket whenever their identities fall
 * back to the same one (an anonymous client: its user and its API key both become its IP). That request
 * then needs the costs of both from one bucket: if they exceed its capacity, it is refused forever.
 */
function assertSharedNamesFit(policies: readonly CompiledPolicy[], route: string): void {
  const byName = new Map<string, CompiledPolicy[]>();
  for (const policy of policies) byName.set(policy.scope, [...(byName.get(policy.scope) ?? []), policy]);
  for (const [name, group] of byName) {
    if (group.length < 2) continue;
    const cost = group.reduce((sum, p) => sum + p.cost, 0);
    const capacity = Math.min(...group.map((p) => p.capacity));
    if (cost > capacity) {
      throw new Error(
        `@RateLimit policies named "${name}" on ${route} can meet on one bucket (a client without a user or API key ` +
          `falls back to its IP) and then need ${cost} tokens of a bucket of ${capacity}, so they would refuse it ` +
          'forever: give them different names, or costs that fit',
      );
    }
  }
}
