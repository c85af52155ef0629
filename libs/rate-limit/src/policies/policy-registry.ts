import { Inject, Injectable, type Type } from '@nestjs/common';
import { PATH_METADATA } from '@nestjs/common/constants.js';
import { DiscoveryService, MetadataScanner, ModulesContainer } from '@nestjs/core';
import { RATE_LIMIT_CONCURRENCY, RATE_LIMIT_POLICIES, RATE_LIMIT_SKIP } from '../rate-limit.constants.js';
import type { RateLimitPolicy } from '../rate-limit.interfaces.js';
import { RATE_LIMIT_OPTIONS } from '../rate-limit.module-definition.js';
import type { ResolvedRateLimitOptions } from '../rate-limit.options.js';
import { type CompiledPolicy, compilePolicy, type PolicyContext } from './policy.js';
import { scopeSuffixes } from './route-names.js';
import { type CompiledConcurrency, compileConcurrency, type ConcurrencyLimitOptions } from './concurrency-option.js';
import { RateLimitConfigError } from '../errors/rate-limit.errors.js';

/** The policies of one limited route, split by the phase that decides them. */
export interface RoutePlan {
  /**
   * `Controller.handler`, for messages, and the scope of its unnamed policies; with what tells its routes
   * apart appended (`UsersController.list@/v2/users`) when another limited class has the same name.
   */
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
  /**
   * Each phase's policies take the plain path: no `skipIf`, no per-request numbers, no shadow policy,
   * and no allow-listed users or API keys to look for. Decided with the plan, not per request.
   */
  plainBefore: boolean;
  plainAfter: boolean;
  /** `@ConcurrencyLimit`: a slot taken after the phase-2 policies allow, given back when the response is done. */
  concurrency: CompiledConcurrency | undefined;
  /**
   * The set-up warnings already said about this route (bits that the pipeline's `SetupWarnings` sets):
   * a later request tests this number, and builds no warning.
   */
  said: number;
}

/** `lists`: `allowList.users` or `allowList.apiKeys` has an entry, which each identity must be looked up in. */
function toPlan(route: string, policies: CompiledPolicy[], lists: boolean, concurrency: CompiledConcurrency | undefined): RoutePlan {
  const before = policies.filter((p) => p.phase === 'before-guards');
  const after = policies.filter((p) => p.phase === 'after-guards');
  const plain = (phase: readonly CompiledPolicy[]) =>
    !lists && phase.every((p) => p.skipIf === undefined && p.dynamic === undefined && p.enforce);
  return {
    route,
    policies,
    beforeGuards: before,
    afterGuards: after,
    order: [...before, ...after].map((p) => policies.indexOf(p)),
    refunds: policies.some((p) => p.refundOn !== undefined),
    plainBefore: plain(before),
    plainAfter: plain(after),
    concurrency,
    said: 0,
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
  /** What start-up appended to the routes of classes whose name another limited class has. */
  private suffixes = new Map<Function, string>();
  /** The policies that took their route's scope (no `name`). */
  private readonly unnamed = new WeakSet<CompiledPolicy>();
  /** The policy names of each class's handlers on which its `@SkipRateLimit('name')` applies, for the start-up check. */
  private readonly classSkipScopes = new Map<Function, Set<string>>();
  /** Each concurrency limit's name, with the first route that used it: routes sharing slots must agree. */
  private readonly concurrencyScopes = new Map<string, { route: string; limit: CompiledConcurrency }>();

  constructor(
    @Inject(RATE_LIMIT_OPTIONS) private readonly options: ResolvedRateLimitOptions,
    private readonly discovery: DiscoveryService,
    private readonly scanner: MetadataScanner,
    private readonly modules: ModulesContainer,
  ) {
    this.context = { apiKeyVerified: options.apiKey !== undefined, enforce: options.enforce, lease: options.lease };
  }

  /**
   * Compiles the module defaults and every route's policies, so that invalid ones stop the start; called
   * by RouteLimiter's start-up checks.
   */
  discoverRoutes(): void {
    // Checked even when no route uses them yet.
    this.compile(this.options.defaults, 'the module options', true);
    const registrations = new Map<Function, Function[]>();
    const handlers = new Map<Function, Function[]>();
    for (const wrapper of [...this.discovery.getControllers(), ...this.discovery.getProviders()]) {
      const type = wrapper.metatype as Type | null;
      if (!type || typeof type !== 'function' || !type.prototype) continue;
      if (!handlers.has(type)) {
        const found = this.scanner.getAllMethodNames(type.prototype).map((name) => type.prototype[name] as Function);
        handlers.set(
          type,
          found.filter((handler) => handlerKind(handler) !== undefined),
        );
      }
      const module = wrapper.host?.metatype;
      if (!this.mayTakeRouteScope(type, handlers.get(type)!)) continue;
      registrations.set(type, [...(registrations.get(type) ?? []), ...(module ? [module] : [])]);
    }
    this.suffixes = scopeSuffixes(registrations, this.modules.applicationId);
    for (const [type, found] of handlers) for (const handler of found) this.planFor(type, handler);
    for (const [type, scopes] of this.classSkipScopes) {
      assertSkippedNamesExist(Reflect.getMetadata(RATE_LIMIT_SKIP, type), scopes, type.name, 'to any of its handlers (their');
    }
    this.assertUnnamedScopesUnique(registrations);
  }

  /** A handler of the class may have a policy without a name (its own, its class's, or a module default). */
  private mayTakeRouteScope(type: Function, handlers: readonly Function[]): boolean {
    return handlers.some((handler) => {
      const policies: RateLimitPolicy[] =
        Reflect.getOwnMetadata(RATE_LIMIT_POLICIES, handler) ?? Reflect.getMetadata(RATE_LIMIT_POLICIES, type) ?? this.options.defaults;
      return policies.some((policy) => policy?.name === undefined);
    });
  }

  /**
   * Two different classes of one name whose routes nothing tells apart would share every unnamed bucket:
   * stop the start, naming both (one class registered in two modules is one class, and no clash).
   */
  private assertUnnamedScopesUnique(registrations: ReadonlyMap<Function, readonly Function[]>): void {
    const owners = new Map<string, Function>();
    for (const { controller, plan } of this.routes()) {
      for (const policy of plan?.policies ?? []) {
        if (!this.unnamed.has(policy)) continue;
        const owner = owners.get(policy.scope);
        if (owner === undefined) owners.set(policy.scope, controller);
        if (owner === undefined || owner === controller) continue;
        const where = (type: Function) => `in ${(registrations.get(type) ?? []).map((module) => module.name).join(', ') || 'no module'}`;
        throw new RateLimitConfigError(
          'ERR_RATE_LIMIT_POLICY_CONFLICT',
          `Two classes named ${controller.name} (${where(owner)} and ${where(controller)}) have the same unnamed rate-limit ` +
            `scope "${policy.scope}": their requests would share buckets, and nothing tells their routes apart (an HTTP ` +
            "controller's path, version or host, a gateway's port or namespace). Name the policies of one of them, " +
            "@RateLimit({ ..., name: 'a-name-of-its-own' }), or rename one class",
        );
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
    const route = `${controller.name}.${handler.name}${this.suffixes.get(controller) ?? ''}`;
    const handlerSkip: unknown = Reflect.getMetadata(RATE_LIMIT_SKIP, handler);
    const controllerSkip: unknown = Reflect.getMetadata(RATE_LIMIT_SKIP, controller);
    if (handlerSkip === true) return null;
    const policies: RateLimitPolicy[] | undefined =
      Reflect.getOwnMetadata(RATE_LIMIT_POLICIES, handler) ??
      (controllerSkip === true && handlerSkip !== false ? [] : Reflect.getMetadata(RATE_LIMIT_POLICIES, controller));
    const chosen = policies ?? this.options.defaults;
    // @SkipRateLimit('name'): those policies are left out here. A name on the handler must name one of its
    // policies; a name on the controller one of the policies of at least one of its handlers (checked by
    // discoverRoutes once every handler is known). @SkipRateLimit(false) on the handler undoes every skip
    // of its controller, named ones included.
    const controllerNames = handlerSkip !== false && Array.isArray(controllerSkip) ? (controllerSkip as string[]) : [];
    let classScopes: Set<string> | undefined;
    if (controllerNames.length > 0) {
      classScopes = this.classSkipScopes.get(controller);
      if (classScopes === undefined) this.classSkipScopes.set(controller, (classScopes = new Set()));
    }
    const concurrencyOptions: unknown =
      Reflect.getOwnMetadata(RATE_LIMIT_CONCURRENCY, handler) ??
      (controllerSkip === true && handlerSkip !== false ? undefined : Reflect.getMetadata(RATE_LIMIT_CONCURRENCY, controller));
    const concurrency = concurrencyOptions === undefined ? undefined : this.concurrencyOf(concurrencyOptions, route);
    const lists = this.options.allowList.users.size > 0 || this.options.allowList.apiKeys.size > 0;
    if (chosen.length === 0) return concurrency === undefined ? null : toPlan(route, [], lists, concurrency);
    let compiled = this.compile(chosen, route, policies === undefined);
    for (const policy of classScopes === undefined ? [] : compiled) classScopes!.add(policy.scope);
    const skipped = new Set([...(Array.isArray(handlerSkip) ? (handlerSkip as string[]) : []), ...controllerNames]);
    if (skipped.size > 0) {
      const scopes = new Set(compiled.map((p) => p.scope));
      if (Array.isArray(handlerSkip)) assertSkippedNamesExist(handlerSkip, scopes, route, 'there (its');
      compiled = compiled.filter((p) => !skipped.has(p.scope));
      if (compiled.length === 0 && concurrency === undefined) return null;
    }
    return toPlan(route, compiled, lists, concurrency);
  }

  /**
   * A route's `@ConcurrencyLimit`: one per handler or class (two stacked are an array). Routes that share
   * a name share the slots, so they must agree on the limit and the lease: a take compares the count with
   * its own limit, and a holder's renewal keeps its own lease.
   */
  private concurrencyOf(options: unknown, route: string): CompiledConcurrency {
    if (Array.isArray(options)) {
      throw new RateLimitConfigError(
        'ERR_RATE_LIMIT_POLICY_CONFLICT',
        `${options.length} @ConcurrencyLimit decorators on ${route}: a route has one (a handler's replaces its controller's)`,
      );
    }
    const compiled = compileConcurrency(options as ConcurrencyLimitOptions, route);
    const first = this.concurrencyScopes.get(compiled.scope);
    if (first === undefined) this.concurrencyScopes.set(compiled.scope, { route, limit: compiled });
    else if (first.limit.limit !== compiled.limit || first.limit.leaseMs !== compiled.leaseMs) {
      throw new RateLimitConfigError(
        'ERR_RATE_LIMIT_POLICY_CONFLICT',
        `@ConcurrencyLimit named "${compiled.scope}" on ${route} has limit ${compiled.limit} and leaseMs ${compiled.leaseMs}, ` +
          `but on ${first.route} limit ${first.limit.limit} and leaseMs ${first.limit.leaseMs}: routes that share slots must agree on both`,
      );
    }
    return compiled;
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
    compiled.forEach((policy, i) => {
      if (chosen[i].name === undefined) this.unnamed.add(policy);
    });
    const buckets = compiled.map((p) => `${typeof p.keyBy === 'function' ? p.keyBy.name : p.keyBy}|${p.scope}`);
    if (new Set(buckets).size !== buckets.length) {
      throw new RateLimitConfigError(
        'ERR_RATE_LIMIT_POLICY_CONFLICT',
        `@RateLimit policies stacked on ${route} share one bucket: give each a different name or keyBy`,
      );
    }
    assertSharedNamesFit(compiled, route);
    return compiled;
  }
}

/** Each name of a `@SkipRateLimit('name')` must be one of `scopes`: a misspelled name would skip nothing, silently. */
function assertSkippedNamesExist(names: readonly string[], scopes: ReadonlySet<string>, where: string, applies: string): void {
  for (const name of names) {
    if (scopes.has(name)) continue;
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_INVALID_SKIP',
      `@SkipRateLimit('${name}') on ${where}: no policy of that name applies ${applies} policies: ${[...scopes].join(', ') || 'none'}); ` +
        'correct the name, or remove it',
    );
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
      throw new RateLimitConfigError(
        'ERR_RATE_LIMIT_POLICY_CONFLICT',
        `@RateLimit policies named "${name}" on ${route} can meet on one bucket (a client without a user or API key ` +
          `falls back to its IP) and then need ${cost} tokens of a bucket of ${capacity}, so they would refuse it ` +
          'forever: give them different names, or costs that fit',
      );
    }
  }
}
