import { type ExecutionContext, Logger } from '@nestjs/common';
import { GUARDS_METADATA } from '@nestjs/common/constants.js';
import type { ApplicationConfig } from '@nestjs/core';
import type { LimitedCall } from '../contexts/limited-call.js';
import { noUserWarning } from '../keys/user-identity.js';
import type { CompiledPolicy } from '../policies/policy.js';
import type { RoutePlan } from '../policies/policy-registry.js';
import { RATE_LIMIT_ENHANCER, RATE_LIMIT_POLICIES } from '../rate-limit.constants.js';
import type { ResolvedRateLimitOptions } from '../rate-limit.options.js';

/** Why a handler of another transport's policy does nothing. */
export const NOT_DECIDED =
  'nest-redis-rate-limit limits HTTP routes, GraphQL resolvers, WebSocket and microservice handlers; limit ' +
  'this one yourself with BucketService.consume(), or remove the decorator';

/** The bits of `RoutePlan.said`: the route-level warnings said so far. */
const UNDECIDED = 1;
const TWICE = 2;
const NO_RESPONSE = 4;
const PROXIED = 8;
const NO_GUARD = 16;

/**
 * Mistakes of set-up, found on a route's first requests: logged once per route (and policy), each: they
 * do not repeat per request. A route's warning, once said, is a bit of its plan (`RoutePlan.said`): the
 * pipeline calls here only on the calls that may have something to say (another transport, a second
 * guard, no response, no guard), and such a call tests that bit and leaves; an HTTP request with its
 * guard and its response does not come here at all.
 */
export class SetupWarnings {
  private readonly logger = new Logger('RateLimit');
  private readonly said = new Set<string>();

  constructor(
    private readonly config: ApplicationConfig,
    private readonly options: ResolvedRateLimitOptions,
  ) {}

  once(key: string, message: string): void {
    if (this.said.has(key)) return;
    this.said.add(key);
    this.logger.warn(message);
  }

  /** A route's warning: said (once per key, as every warning), and marked on its plan so that later calls test one bit. */
  private onceFor(plan: RoutePlan, bit: number, key: string, message: string): void {
    plan.said |= bit;
    this.once(key, message);
  }

  /**
   * A handler of a context type the limiter does not decide (a custom transport): never silently
   * unlimited — a handler with a policy (`plan`) is reported once, at its first call.
   */
  undecided(context: ExecutionContext, plan: RoutePlan): true {
    if ((plan.said & UNDECIDED) !== 0) return true;
    const own =
      Reflect.getMetadata(RATE_LIMIT_POLICIES, context.getHandler()) ?? Reflect.getMetadata(RATE_LIMIT_POLICIES, context.getClass());
    const what = own === undefined ? 'The module defaults' : '@RateLimit';
    const type = context.getType<string>();
    this.onceFor(
      plan,
      UNDECIDED,
      `undecided|${plan.route}`,
      `${what} on ${plan.route} (a '${type}' handler) is not enforced: ${NOT_DECIDED}`,
    );
    return true;
  }

  /**
   * A call without a response (`call.response` undefined). A GraphQL call over HTTP whose context holds
   * no response (Apollo over Fastify passes only the request by default) cannot carry the headers: said
   * once per resolver, with the fix. A subscription (no HTTP request either) has none to carry them, as
   * documented. What depends on the call (a proxied ws message, a GraphQL context) is one test each.
   */
  noResponse(call: LimitedCall, plan: RoutePlan): void {
    if (call.proxied === true && (plan.said & PROXIED) === 0) this.behindProxy(plan);
    if ((plan.said & NO_RESPONSE) !== 0 || call.kind !== 'graphql' || call.request?.raw === undefined) return;
    this.onceFor(
      plan,
      NO_RESPONSE,
      `noresponse|${plan.route}`,
      `The GraphQL context of ${plan.route} has the request but no response, so rate-limit headers are not sent ` +
        '(the limit applies all the same). With Apollo over Fastify, put the reply in the context: ' +
        'GraphQLModule.forRoot({ ..., context: (request, reply) => ({ req: request, reply }) })',
    );
  }

  /** A ws message through a trusted proxy: whose it is cannot be told (said once per handler). */
  private behindProxy(plan: RoutePlan): void {
    this.onceFor(
      plan,
      PROXIED,
      `proxied|${plan.route}`,
      `Messages of ${plan.route} come through a trusted proxy, and ws keeps no handshake headers: their IP-keyed ` +
        'policies share one bucket (ip:unknown) and allowList.ips exempts none of them. Keep the client address ' +
        'from the upgrade request in handleConnection(client, request) and key the policy by it (a keyBy function)',
    );
  }

  /** A second rate-limit guard on a request that `first` decided already. */
  guardRanTwice(plan: RoutePlan, first: object | undefined, second: object): void {
    if ((plan.said & TWICE) !== 0) return;
    const name = (guard: object | undefined) => (guard === undefined ? 'none' : guard.constructor.name);
    this.onceFor(
      plan,
      TWICE,
      `twice|${plan.route}`,
      `Two rate-limit guards run on ${plan.route} (${name(first)}, then ${name(second)}): only the first decides. ` +
        'When you register RateLimitGuard (or a subclass) yourself, set RateLimitModule.forRoot({ guard: false })',
    );
  }

  /** No `RateLimitGuard` ran before a route whose policies are due before the app's guards. */
  noGuard(plan: RoutePlan): void {
    if ((plan.said & NO_GUARD) !== 0) return;
    this.onceFor(
      plan,
      NO_GUARD,
      `noguard|${plan.route}`,
      `No RateLimitGuard ran before ${plan.route} (guard: false?): its policies are decided after your guards, ` +
        'so requests they refuse are not counted. Register RateLimitGuard, or remove guard: false',
    );
  }

  /** A `keyBy: 'user'` policy found no user on the request (it falls back to the IP): said once per route and policy. */
  noUser(context: ExecutionContext, request: any, plan: RoutePlan, policy: Pick<CompiledPolicy, 'scope'>, user: unknown): void {
    const key = `nouser|${plan.route}|${policy.scope}`;
    if (this.said.has(key)) return;
    const where = `${plan.route}${policy.scope === plan.route ? '' : ` (${policy.scope})`}`;
    const guarded = this.appGuardsRunOn(context.getClass(), context.getHandler());
    this.once(key, noUserWarning(where, request, guarded, this.options.user === undefined ? undefined : { got: user }));
  }

  /** Whether a guard of the app (not ours) runs on a handler: global, on its class or on itself. */
  private appGuardsRunOn(controller: Function, handler: Function): boolean {
    const guards: unknown[] = [
      ...this.config.getGlobalGuards(),
      ...this.config.getGlobalRequestGuards().map((wrapper) => wrapper.instance ?? wrapper.metatype),
      ...(Reflect.getMetadata(GUARDS_METADATA, controller) ?? []),
      ...(Reflect.getMetadata(GUARDS_METADATA, handler) ?? []),
    ];
    return guards.some((guard) => guard != null && !isOurs(guard));
  }
}

/** A guard or interceptor of this library (a class or an instance, subclasses included). */
export function isOurs(enhancer: unknown): boolean {
  const type = typeof enhancer === 'function' ? enhancer : (enhancer as object | null)?.constructor;
  return typeof type === 'function' && RATE_LIMIT_ENHANCER in type;
}
