import {
  type ExecutionContext,
  HttpException,
  Inject,
  Injectable,
  Logger,
  type OnApplicationBootstrap,
  type OnModuleInit,
  ServiceUnavailableException,
} from '@nestjs/common';
import { GUARDS_METADATA, INTERCEPTORS_METADATA } from '@nestjs/common/constants.js';
import { ApplicationConfig, HttpAdapterHost, ModuleRef, ModulesContainer } from '@nestjs/core';
import type { Observable } from 'rxjs';
// From 'rxjs/operators': the 'rxjs' entry point exports operators only since 7.2, and the peer range starts at 7.1.
import { catchError, mergeMap } from 'rxjs/operators';
import { RateLimitEvents } from '../events/rate-limit-events.js';
import type { RateLimitIdentity } from '../rate-limit.interfaces.js';
import { AddressList } from './allow-list.js';
import { fieldResolverWarnings } from './field-resolver-check.js';
import { PolicyNumbers } from './policy-numbers.js';
import { BucketService } from '../bucket/bucket.service.js';
import type { Verdict, VerdictSource } from '../rate-limit.interfaces.js';
import { Deadlines, RateLimitTimeoutError } from '../engine/with-timeout.js';
import { type BucketRequest, toDecision } from '../stores/token-bucket.js';
import { RateLimitHeadersWriter } from '../headers/rate-limit-headers.writer.js';
import { createDigest, type Digest, ipIdentity, routeIdentity, routeKey } from '../keys/identity.js';
import { defaultUserId, isUserId, noUserWarning } from '../keys/user-identity.js';
import type { CompiledPolicy } from '../policies/policy.js';
import { handlerKind, PolicyRegistry, type RoutePlan } from '../policies/policy-registry.js';
import {
  RATE_LIMIT_ENHANCER,
  RATE_LIMIT_GUARD_REPLACED,
  RATE_LIMIT_POLICIES,
  RATE_LIMIT_VERDICT,
} from '../rate-limit.constants.js';
import { isEventHandler, refusalFor } from './transport-errors.js';
import { type CallKind, type LimitedCall, limitedCall } from '../contexts/limited-call.js';
import { ClientAddresses } from '../contexts/client-address.js';
import { RATE_LIMIT_OPTIONS } from '../rate-limit.module-definition.js';
import type { ResolvedRateLimitOptions } from '../rate-limit.options.js';
import { BucketStore } from '../stores/bucket-store.interface.js';
import { ThrottledLogger } from '../throttled-logger.js';

/** Where a request's identities come from, and what a refusal throws: `RateLimitGuard`'s overridable hooks. */
export interface RequestHooks {
  getIp(request: any): string | undefined;
  getUserId(request: any): string | number | undefined;
  getApiKey(request: any): string | undefined | Promise<string | undefined>;
  throwRateLimitException(context: ExecutionContext, verdict: Verdict): never;
}

/** What the limiter leaves on the request, under `RATE_LIMIT_VERDICT`, for code that runs after it. */
export interface RateLimitState {
  /**
   * The enforced policies decided so far (skipped ones left out; per-request numbers filled in): those
   * of the guard, then (after the interceptor) all of the route's.
   */
  policies: readonly CompiledPolicy[];
  /** The verdict over `policies`; undefined while none has been decided. */
  verdict: Verdict | undefined;
  /** Shadow policies (`enforce: false`) decided so far, and their verdict: what enforcing them would have done. */
  shadow: { policies: readonly CompiledPolicy[]; verdict: Verdict } | undefined;
}

/** The policies one phase decided, each with its bucket request and its position among the route's policies. */
interface Decided {
  policies: CompiledPolicy[];
  requests: BucketRequest[];
  positions: number[];
  verdict: Verdict;
}

/** What one phase took: enforced and shadow policies are decided apart (a shadow refusal never refuses). */
interface PhaseTake {
  enforced: Decided | undefined;
  shadow: Decided | undefined;
}

interface RequestState extends RateLimitState {
  /** The transport of the call: what a refusal throws. */
  kind: CallKind;
  plan: RoutePlan;
  hooks: RequestHooks;
  /** The guard instance that decided the first phase (`undefined`: the interceptor did, without a guard). */
  owner: object | undefined;
  before: PhaseTake | undefined;
  after: PhaseTake | undefined;
  /** The interceptor has run: a second one on the same request does nothing. */
  settled: boolean;
  /** The client is on `allowList.ips`: nothing is decided. Undefined until checked. */
  exempt: boolean | undefined;
  /** Refunds by outcome have been given (once per request). */
  refunded: boolean;
}

/** A request's identity for one policy: what kind, its value (for resolvers and allow-lists), and its part of the key. */
interface Who extends RateLimitIdentity {
  id: string;
}

/** Why a handler of another transport's policy does nothing. */
export const NOT_DECIDED =
  'nest-redis-rate-limit limits HTTP routes, GraphQL resolvers, WebSocket and microservice handlers; limit ' +
  'this one yourself with BucketService.consume(), or remove the decorator';

/** The source a merged verdict reports: a failure of either phase wins, so headers never claim numbers nobody has. */
const SOURCE_RANK: Record<VerdictSource, number> = { store: 0, cache: 1, local: 2, open: 3, closed: 4 };

/**
 * Decides route policies, in the phases Nest's request pipeline gives them:
 *
 * 1. **Before the app's guards** (`RateLimitGuard`, registered first, globally): policies whose identity is
 *    on the raw request — the IP, an unverified API key header. They count requests the app's guards
 *    then refuse, so a login limit holds against attempts that fail authentication.
 * 2. **After the app's guards** (`RateLimitInterceptor`, which `@RateLimit` applies where a policy may
 *    need it): policies whose identity the app establishes — `req.user`, a key verified by
 *    `keys.apiKey`, keyBy functions. If one refuses, what phase 1 took is given back, so a request is
 *    still all-or-nothing.
 *
 * Headers of an allowed response are written once the route's verdict is final: by the guard when no
 * policy is left for phase 2, else by the interceptor.
 *
 * Each phase is one store call (one atomic script per identity group on a Cluster).
 */
@Injectable()
export class RouteLimiter implements OnModuleInit, OnApplicationBootstrap {
  private readonly logger = new ThrottledLogger('RateLimit');
  /** What shadow policies would have refused: logged apart, so that failures do not hide it. */
  private readonly shadowLogger = new ThrottledLogger('RateLimit');
  /** Microservice events refused, which no client hears of: a throttled warning per handler. */
  private readonly dropLoggers = new Map<string, ThrottledLogger>();
  /** Mistakes of set-up are logged once per route (and policy), each: they do not repeat per request. */
  private readonly setupLogger = new Logger('RateLimit');
  private readonly said = new Set<string>();
  private readonly hash: Digest;
  /** Identities as the module options define them; `RateLimitGuard` subclasses override them. */
  readonly defaultHooks: RequestHooks;
  /** An asynchronous hook (`keys.apiKey`, a keyBy function, skipIf, per-request numbers) gets `timeoutMs`, like the store. */
  private readonly hookDeadlines: Deadlines;
  private readonly allowedIps: AddressList;
  private readonly numbers: PolicyNumbers;
  /** WebSocket clients' addresses, with the app's trust-proxy setting. */
  private readonly addresses: ClientAddresses;
  /** Per-policy work beyond the plain path: skips, allow-listed identities, per-request numbers, shadow mode. */
  private readonly plainPolicies = new WeakMap<readonly CompiledPolicy[], boolean>();

  constructor(
    private readonly registry: PolicyRegistry,
    private readonly buckets: BucketService,
    private readonly headers: RateLimitHeadersWriter,
    @Inject(RATE_LIMIT_OPTIONS) readonly options: ResolvedRateLimitOptions,
    private readonly modules: ModulesContainer,
    private readonly config: ApplicationConfig,
    private readonly events: RateLimitEvents,
    @Inject(BucketStore) private readonly store: BucketStore,
    private readonly moduleRef: ModuleRef,
    /** A test replaced the module's guard (`overrideGuard(RateLimitGuard)`): what it left undecided stays so. */
    @Inject(RATE_LIMIT_GUARD_REPLACED) private readonly guardReplaced: boolean,
  ) {
    this.hash = createDigest(options.secret);
    this.hookDeadlines = new Deadlines(options.timeoutMs);
    this.allowedIps = new AddressList(options.allowList.ips);
    this.addresses = new ClientAddresses(() => moduleRef.get(HttpAdapterHost, { strict: false }));
    this.numbers = new PolicyNumbers(moduleRef, this.hookDeadlines, options.resolverCacheMs, (key, message) =>
      this.once(key, message),
    );
    const apiKeyHeader = options.apiKeyHeader;
    this.defaultHooks = {
      // A request without `ip` is a handshake's (graphql-ws): resolved as the app's platform resolves `req.ip`.
      getIp: (request) => request.ip ?? this.addresses.ofRequest(request),
      getUserId: options.user ?? defaultUserId,
      getApiKey:
        options.apiKey ??
        ((request) => {
          const value = request.headers?.[apiKeyHeader];
          return Array.isArray(value) ? value[0] : value;
        }),
      throwRateLimitException: (context, verdict) => {
        throw refusalFor(context, longestWait(verdict), 'RATE_LIMITED');
      },
    };
  }

  onModuleInit(): void {
    this.atStart(() => {
      this.registry.discoverRoutes();
      this.assertImportedOnce();
    });
    this.warnRawApiKeys();
  }

  /**
   * Without `keys.apiKey`, an API key is whatever the client sends: a new made-up key per request is a
   * new bucket per request. Said once at start-up, naming the routes that no enforced per-IP policy bounds.
   */
  private warnRawApiKeys(): void {
    if (this.options.apiKey !== undefined) return;
    const routes = new Set<string>();
    for (const { plan } of this.registry.routes()) {
      const policies = plan?.policies ?? [];
      const byKey = policies.some((policy) => policy.keyBy === 'apiKey');
      const byIp = policies.some((policy) => policy.keyBy === 'ip' && policy.enforce);
      if (byKey && !byIp) routes.add(plan!.route);
    }
    if (routes.size === 0) return;
    this.once(
      'raw-api-key',
      `keyBy 'apiKey' on ${[...routes].join(', ')} trusts the ${this.options.apiKeyHeader} header as sent (keys.apiKey ` +
        'is not set): a client that invents a new key for each request gets a new bucket each time, so these routes ' +
        'are not limited. Set keys: { apiKey: (req) => ... } to look the key up and return undefined for an unknown ' +
        "one (it then counts as its sender's IP), or stack a per-IP @RateLimit beside it",
    );
  }

  /** Global guards and interceptors are all known by now, `useGlobalGuards()` ones included. */
  async onApplicationBootstrap(): Promise<void> {
    await this.atStart(async () => {
      if (!this.options.guard) this.assertEveryLimitedRouteRuns();
      for (const warning of fieldResolverWarnings(this.moduleRef, this.registry.routes())) this.once(warning, warning);
      // Every resolver is built now: one Nest cannot build stops the start, naming its route.
      for (const { plan } of this.registry.routes()) {
        for (const policy of plan?.policies ?? []) {
          if (policy.dynamic?.resolve) await this.numbers.resolver(policy.dynamic.resolve, plan!.route);
        }
      }
    });
  }

  /**
   * Runs start-up checks. One that fails stops the start, and Nest then calls no shutdown hook: the
   * store's own Redis connection is dropped first, so that `bootstrap().catch(log)` does not leave a
   * process that neither serves nor exits.
   */
  private atStart<T>(checks: () => T): T {
    const abandon = (error: unknown): never => {
      this.store.abandon?.();
      throw error;
    };
    try {
      const result = checks();
      return (result instanceof Promise ? result.catch(abandon) : result) as T;
    } catch (error) {
      return abandon(error);
    }
  }

  /** Phase 1, in `RateLimitGuard`. `owner` is the guard instance: a second guard on the same request decides nothing. */
  beforeGuards(context: ExecutionContext, hooks: RequestHooks, owner: object): boolean | Promise<boolean> {
    const call = limitedCall(context, this.addresses);
    if (call === undefined) return this.undecided(context);
    const plan = this.registry.planFor(context.getClass(), context.getHandler());
    if (plan === null) return true;
    const existing: RequestState | undefined = call.carrier[RATE_LIMIT_VERDICT];
    if (existing !== undefined) {
      if (existing.owner !== owner) this.guardRanTwice(plan, existing.owner, owner);
      return true;
    }
    const state = newState(plan, hooks, owner, call.kind);
    call.carrier[RATE_LIMIT_VERDICT] = state;
    if (call.response === undefined) this.noResponse(call, plan);
    if (this.isExempt(state, call.request)) return true;
    if (plan.beforeGuards.length === 0) return true;
    return this.decideBefore(context, state, call.request, call.response).then(() => true);
  }

  /**
   * A handler of a context type the limiter does not decide (a custom transport): never silently
   * unlimited — a handler with a policy is reported once, at its first call.
   */
  private undecided(context: ExecutionContext): true {
    const controller = context.getClass();
    const handler = context.getHandler();
    const plan = this.registry.planFor(controller, handler);
    if (plan !== null) this.reportUndecided(controller, handler, plan, context.getType<string>());
    return true;
  }

  /**
   * A GraphQL call over HTTP whose context holds no response (Apollo over Fastify passes only the
   * request by default) cannot carry the headers: said once per resolver, with the fix. A subscription
   * (no HTTP request either) has none to carry them, as documented.
   */
  private noResponse(call: LimitedCall, plan: RoutePlan): void {
    if (call.proxied) this.behindProxy(plan);
    if (call.kind !== 'graphql' || call.request?.raw === undefined) return;
    this.once(
      `noresponse|${plan.route}`,
      `The GraphQL context of ${plan.route} has the request but no response, so rate-limit headers are not sent ` +
        '(the limit applies all the same). With Apollo over Fastify, put the reply in the context: ' +
        'GraphQLModule.forRoot({ ..., context: (request, reply) => ({ req: request, reply }) })',
    );
  }

  /** A ws message through a trusted proxy: whose it is cannot be told (said once per handler). */
  private behindProxy(plan: RoutePlan): void {
    this.once(
      `proxied|${plan.route}`,
      `Messages of ${plan.route} come through a trusted proxy, and ws keeps no handshake headers: their IP-keyed ` +
        'policies share one bucket (ip:unknown) and allowList.ips exempts none of them. Keep the client address ' +
        'from the upgrade request in handleConnection(client, request) and key the policy by it (a keyBy function)',
    );
  }

  /** An event has no reply to carry its refusal: said here (at most every 10 s per handler), then dropped. */
  private eventDropped(route: string, verdict: Verdict): void {
    let logger = this.dropLoggers.get(route);
    if (logger === undefined) this.dropLoggers.set(route, (logger = new ThrottledLogger('RateLimit')));
    logger.warn(
      verdict.source === 'closed'
        ? `Event of ${route} dropped: rate limiting is unavailable (failureMode 'closed')`
        : `Event of ${route} dropped: rate limited (retry after ${longestWait(verdict)} s)`,
    );
  }

  private reportUndecided(controller: Function, handler: Function, plan: RoutePlan, type: string): void {
    const own = Reflect.getMetadata(RATE_LIMIT_POLICIES, handler) ?? Reflect.getMetadata(RATE_LIMIT_POLICIES, controller);
    const what = own === undefined ? 'The module defaults' : '@RateLimit';
    this.once(`undecided|${plan.route}`, `${what} on ${plan.route} (a '${type}' handler) is not enforced: ${NOT_DECIDED}`);
  }

  /** Phase 2, in `RateLimitInterceptor`, before the handler runs. Undefined when there is nothing to wait for. */
  afterGuards(context: ExecutionContext): Promise<void> | undefined {
    const call = limitedCall(context, this.addresses);
    if (call === undefined) {
      this.undecided(context);
      return undefined;
    }
    const plan = this.registry.planFor(context.getClass(), context.getHandler());
    if (plan === null) return undefined;
    const state: RequestState | undefined = call.carrier[RATE_LIMIT_VERDICT];
    if (state === undefined) return this.guardReplaced ? undefined : this.withoutGuard(context, plan, call);
    if (state.settled) return undefined;
    state.settled = true;
    if (state.exempt) return undefined;
    return this.decideAfter(context, state, call.request, call.response);
  }

  /**
   * After the handler, in `RateLimitInterceptor`: gives back the tokens of policies whose `refundOn`
   * matches the outcome, before the response is sent, and updates its headers. `stream` unchanged when
   * nothing on the request can be refunded.
   */
  afterHandler(context: ExecutionContext, stream: Observable<unknown>): Observable<unknown> {
    const call = limitedCall(context, this.addresses);
    if (call === undefined) return stream;
    const state: RequestState | undefined = call.carrier[RATE_LIMIT_VERDICT];
    if (state === undefined || !state.plan.refunds || state.refunded) return stream;
    const { response } = call;
    return stream.pipe(
      mergeMap(async (value) => {
        // A resolver that returned succeeded, whatever the status of the HTTP response its operation shares.
        await this.refundByOutcome(state, response, call.kind === 'http' ? statusOf(response) : 200, undefined);
        return value;
      }),
      catchError(async (error: unknown) => {
        await this.refundByOutcome(state, response, error instanceof HttpException ? error.getStatus() : 500, error);
        throw error;
      }),
    );
  }

  /** No `RateLimitGuard` ran (`guard: false` and none placed on this route): both phases here, and say so once. */
  private async withoutGuard(context: ExecutionContext, plan: RoutePlan, call: LimitedCall): Promise<void> {
    const { request, response } = call;
    // WebSocket and microservice handlers have the interceptor of their own (the global guard may not
    // reach them: connectMicroservice() without inheritAppConfig); nothing to warn about.
    if (plan.beforeGuards.length > 0 && (call.kind === 'http' || call.kind === 'graphql')) {
      this.once(
        `noguard|${plan.route}`,
        `No RateLimitGuard ran before ${plan.route} (guard: false?): its policies are decided after your guards, ` +
          'so requests they refuse are not counted. Register RateLimitGuard, or remove guard: false',
      );
    }
    const state = newState(plan, this.defaultHooks, undefined, call.kind);
    call.carrier[RATE_LIMIT_VERDICT] = state;
    if (response === undefined) this.noResponse(call, plan);
    if (this.isExempt(state, request)) return;
    if (plan.beforeGuards.length > 0) await this.decideBefore(context, state, request, response);
    if (state.settled) return;
    state.settled = true;
    return this.decideAfter(context, state, request, response);
  }

  /** `allowList.ips`: checked once per request, before anything is decided. */
  private isExempt(state: RequestState, request: any): boolean {
    if (this.allowedIps.empty) return (state.exempt = false);
    return (state.exempt = this.allowedIps.has(state.hooks.getIp(request)));
  }

  private async decideBefore(context: ExecutionContext, state: RequestState, request: any, response: unknown): Promise<void> {
    const { plan } = state;
    const take = await this.decidePhase(context, state, request, plan.beforeGuards, 0);
    state.before = take;
    this.publish(state, take, undefined, context);
    const verdict = take.enforced?.verdict;
    if (verdict !== undefined && !verdict.allowed) this.refuse(context, response, state, verdict);
    if (plan.afterGuards.length === 0) {
      // Nothing is left for after the app's guards: the route's verdict is final, and its headers go now.
      state.settled = true;
      if (verdict !== undefined) this.headers.write(response, state.policies, verdict);
    }
  }

  private async decideAfter(context: ExecutionContext, state: RequestState, request: any, response: unknown): Promise<void> {
    const { plan } = state;
    const first = state.before?.enforced;
    let take: PhaseTake;
    try {
      take = await this.decidePhase(context, state, request, plan.afterGuards, plan.beforeGuards.length);
    } catch (error) {
      // A 400 for a cost, a 500 for numbers nobody can compute: the request is refused, so phase 1 takes
      // nothing either, its shadow policies included (enforced, they would have been given back too).
      if (first?.verdict.allowed) first.verdict = await this.giveBack(first);
      const shadowFirst = state.before?.shadow;
      if (shadowFirst?.verdict.allowed) shadowFirst.verdict = await this.giveBack(shadowFirst);
      throw error;
    }
    state.after = take;
    const after = take.enforced;
    if (after !== undefined && !after.verdict.allowed && first !== undefined && first.verdict.allowed) {
      first.verdict = await this.giveBack(first);
    }
    // Phase 1's shadow tokens go back when the request is refused after all, as enforced ones would.
    const shadowFirst = state.before?.shadow;
    if (shadowFirst?.verdict.allowed && (after?.verdict.allowed === false || take.shadow?.verdict.allowed === false)) {
      shadowFirst.verdict = await this.giveBack(shadowFirst);
    }
    this.publish(state, state.before, take, context);
    const verdict = state.verdict;
    if (verdict === undefined) return;
    if (!verdict.allowed) this.refuse(context, response, state, verdict);
    this.headers.write(response, state.policies, verdict);
  }

  /**
   * Decides one phase's policies: skips what `skipIf` and the allow-list exempt, computes per-request
   * numbers, and asks the store once for the enforced policies and once (at the same time) for the
   * shadow ones. `offset` is the phase's first position in `plan.order`.
   */
  private async decidePhase(
    context: ExecutionContext,
    state: RequestState,
    request: any,
    policies: readonly CompiledPolicy[],
    offset: number,
  ): Promise<PhaseTake> {
    const { plan, hooks } = state;
    if (policies.length === 0) return NOTHING;
    if (this.options.skipIf !== undefined && (await this.says(this.options.skipIf, context, 'skipIf (module)'))) return NOTHING;
    const plain = this.isPlain(policies);
    const enforced = newDecided();
    let shadow: Decided | undefined;
    for (let i = 0; i < policies.length; i++) {
      let policy = policies[i];
      if (policy.skipIf !== undefined && (await this.says(policy.skipIf, context, `skipIf of ${policy.scope}`))) continue;
      const found = this.identityOf(context, request, plan, policy, hooks);
      const who = 'then' in found ? await found : found;
      if (!plain && this.allowListed(who)) continue;
      if (policy.dynamic !== undefined) {
        const numbers = await this.numbers.numbersOf(context, plan.route, policy, who);
        policy = { ...policy, capacity: numbers.capacity, refillPerSecond: numbers.refillPerSecond, cost: numbers.cost };
      }
      const into = policy.enforce ? enforced : (shadow ??= newDecided());
      into.policies.push(policy);
      into.positions.push(plan.order[offset + i]);
      into.requests.push({
        key: routeKey(this.options.keyPrefix, who.id, policy.keySuffix),
        capacity: policy.capacity,
        refillPerSecond: policy.refillPerSecond,
        cost: policy.cost,
        blockSeconds: policy.blockSeconds,
        penaltyCost: policy.penaltyCost,
      });
    }
    const hasEnforced = enforced.requests.length > 0;
    if (plain) {
      // Every policy decided as written: keep the route's own list, whose header text is built once.
      enforced.policies = policies as CompiledPolicy[];
      enforced.verdict = await this.buckets.decide(enforced.requests);
      return { enforced, shadow: undefined };
    }
    if (hasEnforced) enforced.verdict = await this.buckets.decide(enforced.requests);
    // Shadow policies drain what they would once enforced: nothing on a request that the enforced ones,
    // or the shadow ones of the phase before, refuse (enforced, they would not be reached).
    const reached = (!hasEnforced || enforced.verdict.allowed) && state.before?.shadow?.verdict.allowed !== false;
    if (shadow !== undefined && !reached) shadow = undefined;
    if (shadow !== undefined) {
      shadow.verdict = await this.buckets.decide(shadow.requests);
      if (!shadow.verdict.allowed) this.shadowRefused(plan, shadow);
    }
    return { enforced: hasEnforced ? enforced : undefined, shadow };
  }

  /** Whether a phase's policies take the plain path: no skips, no per-request numbers, no shadow, no allow-listed identities. */
  private isPlain(policies: readonly CompiledPolicy[]): boolean {
    let plain = this.plainPolicies.get(policies);
    if (plain === undefined) {
      const lists = this.options.allowList.users.size > 0 || this.options.allowList.apiKeys.size > 0;
      plain = !lists && policies.every((p) => p.skipIf === undefined && p.dynamic === undefined && p.enforce);
      this.plainPolicies.set(policies, plain);
    }
    return plain;
  }

  private allowListed(who: Who): boolean {
    const { users, apiKeys } = this.options.allowList;
    return (who.kind === 'user' && users.has(who.value)) || (who.kind === 'apiKey' && apiKeys.has(who.value));
  }

  /** The state after a phase: the enforced policies and verdict so far (both phases merged), the shadow ones, and the events. */
  private publish(
    state: RequestState,
    before: PhaseTake | undefined,
    after: PhaseTake | undefined,
    context: ExecutionContext | undefined,
  ): void {
    const a = before?.enforced;
    const b = after?.enforced;
    if (a !== undefined && b !== undefined) {
      const merged = mergeDecided(state.plan, a, b);
      state.policies = merged.policies;
      state.verdict = merged.verdict;
    } else if (a !== undefined || b !== undefined) {
      const only = (a ?? b)!;
      state.policies = only.policies;
      state.verdict = only.verdict;
    }
    const sa = before?.shadow;
    const sb = after?.shadow;
    if (sa !== undefined || sb !== undefined) {
      const merged = sa !== undefined && sb !== undefined ? mergeDecided(state.plan, sa, sb) : (sa ?? sb)!;
      state.shadow = { policies: merged.policies, verdict: merged.verdict };
    }
    if (context !== undefined && this.events.decisionsWatched) {
      // Each policy is reported once, by the phase that decided it.
      const take = after ?? before;
      if (take !== undefined) this.report(state, take, context);
    }
  }

  private report(state: RequestState, take: PhaseTake, context: ExecutionContext): void {
    for (const [decided, shadow] of [
      [take.enforced, false],
      [take.shadow, true],
    ] as const) {
      if (decided === undefined) continue;
      const { verdict } = decided;
      decided.policies.forEach((policy, i) => {
        const decision = verdict.decisions[i];
        this.events.decision({
          route: state.plan.route,
          scope: policy.scope,
          outcome: verdict.allowed ? 'allowed' : shadow ? 'shadow-denied' : 'denied',
          source: verdict.source,
          limit: decision.limit,
          remaining: decision.remaining,
          retryAfterSeconds: decision.retryAfterSeconds,
          context,
        });
      });
    }
  }

  private shadowRefused(plan: RoutePlan, shadow: Decided): void {
    const short = shadow.policies.filter((_, i) => shadow.verdict.decisions[i].retryAfterSeconds > 0).map((p) => p.scope);
    this.shadowLogger.warn(
      `Shadow policy ${short.join(', ') || shadow.policies.map((p) => p.scope).join(', ')} on ${plan.route} would have refused a request ` +
        `(retry after ${longestWait(shadow.verdict)} s); it went on (enforce: false)`,
    );
  }

  /** Returns what phase 1 took; the verdict it answers describes the buckets after the refund, as refused. */
  private async giveBack(take: Decided): Promise<Verdict> {
    const tokens = await this.buckets.giveBack(take.requests, take.verdict.source);
    const decisions = take.requests.map((request, i) =>
      tokens === undefined
        ? { ...take.verdict.decisions[i], allowed: false, retryAfterSeconds: 0 }
        : toDecision(request, tokens[i], request.cost, false),
    );
    return { allowed: false, source: take.verdict.source, decisions };
  }

  /**
   * Refunds by outcome: for each decided policy that took tokens and whose `refundOn` matches, the tokens
   * go back (one store call per phase and kind); the headers are written again from the buckets after
   * the refund, unless the response has gone.
   */
  private async refundByOutcome(state: RequestState, response: any, status: number, error: unknown): Promise<void> {
    if (state.refunded) return;
    state.refunded = true;
    let changed = false;
    for (const take of [state.before, state.after]) {
      for (const decided of [take?.enforced, take?.shadow]) {
        if (decided === undefined || !decided.verdict.allowed) continue;
        const picked: number[] = [];
        decided.policies.forEach((policy, i) => {
          if (policy.refundOn !== undefined && this.matches(policy, status, error, state.plan)) picked.push(i);
        });
        if (picked.length === 0) continue;
        const requests = picked.map((i) => decided.requests[i]);
        const tokens = await this.buckets.giveBack(requests, decided.verdict.source);
        if (tokens === undefined || decided === take?.shadow) continue;
        const decisions = decided.verdict.decisions.slice();
        picked.forEach((i, j) => (decisions[i] = toDecision(decided.requests[i], tokens[j], decided.requests[i].cost, true)));
        decided.verdict = { ...decided.verdict, decisions };
        changed = true;
      }
    }
    if (!changed) return;
    this.publish(state, state.before, state.after, undefined);
    if (state.verdict !== undefined && !headersSent(response)) this.headers.write(response, state.policies, state.verdict);
  }

  private matches(policy: CompiledPolicy, status: number, error: unknown, plan: RoutePlan): boolean {
    const failed = error !== undefined || status >= 400;
    const { refundOn } = policy;
    if (refundOn === 'success') return !failed;
    if (refundOn === 'failure') return failed;
    try {
      return refundOn!(status, error) === true;
    } catch (thrown) {
      this.logger.warn(`refundOn of ${policy.scope} on ${plan.route} threw (${describeError(thrown)}); nothing refunded`);
      return false;
    }
  }

  private refuse(context: ExecutionContext, response: unknown, state: RequestState, verdict: Verdict): never {
    if (state.kind === 'rpc' && isEventHandler(context)) this.eventDropped(state.plan.route, verdict);
    if (verdict.source === 'closed') {
      const retryAfter = Math.max(1, Math.ceil(this.options.timeoutMs / 1000));
      this.headers.writeRetryAfter(response, retryAfter);
      if (state.kind !== 'http') throw refusalFor(context, retryAfter, 'RATE_LIMIT_UNAVAILABLE');
      throw new ServiceUnavailableException('Rate limiting is unavailable; try again shortly');
    }
    this.headers.write(response, state.policies, verdict);
    return state.hooks.throwRateLimitException(context, verdict);
  }

  /** A `skipIf` hook's answer: true skips. One that throws or hangs skips nothing (and is logged). */
  private async says(hook: (context: ExecutionContext) => boolean | Promise<boolean>, context: ExecutionContext, name: string): Promise<boolean> {
    try {
      return (await this.bounded(hook(context))) === true;
    } catch (error) {
      this.logger.warn(`${name} ${failure(error)}; the policy is applied`);
      return false;
    }
  }

  /** The identity whose bucket a policy drains. A missing user or API key, or a failing hook, falls back to the IP. */
  private identityOf(
    context: ExecutionContext,
    request: any,
    plan: RoutePlan,
    policy: CompiledPolicy,
    hooks: RequestHooks,
  ): Who | Promise<Who> {
    const { keyBy } = policy;
    if (keyBy === 'ip') return ipWho(hooks.getIp(request));
    if (keyBy === 'user') {
      let user: unknown;
      try {
        user = hooks.getUserId(request);
      } catch (error) {
        this.logger.warn(`keys.user threw (${describeError(error)}); using the IP bucket`);
      }
      if (isUserId(user)) {
        const value = String(user);
        return { kind: 'user', value, id: routeIdentity({ user: value }, this.hash) };
      }
      const key = `nouser|${plan.route}|${policy.scope}`;
      if (!this.said.has(key)) {
        const where = `${plan.route}${policy.scope === plan.route ? '' : ` (${policy.scope})`}`;
        const guarded = this.appGuardsRunOn(context.getClass(), context.getHandler());
        this.once(key, noUserWarning(where, request, guarded, this.options.user === undefined ? undefined : { got: user }));
      }
      return ipWho(hooks.getIp(request));
    }
    if (keyBy === 'apiKey') return this.apiKeyIdentity(request, hooks);
    return this.functionIdentity(context, request, keyBy, hooks);
  }

  private async apiKeyIdentity(request: any, hooks: RequestHooks): Promise<Who> {
    let key: unknown;
    try {
      key = await this.bounded(hooks.getApiKey(request));
    } catch (error) {
      this.logger.warn(`keys.apiKey ${failure(error)}; using the IP bucket`);
    }
    return typeof key === 'string' && key !== ''
      ? { kind: 'apiKey', value: key, id: routeIdentity({ apiKey: key }, this.hash) }
      : ipWho(hooks.getIp(request));
  }

  private async functionIdentity(
    context: ExecutionContext,
    request: any,
    keyBy: (context: ExecutionContext) => string | Promise<string>,
    hooks: RequestHooks,
  ): Promise<Who> {
    const name = keyBy.name || '(anonymous)';
    try {
      const value: unknown = await this.bounded(keyBy(context));
      if (typeof value === 'string' && value !== '') return { kind: 'custom', value, id: routeIdentity({ id: value }, this.hash) };
      this.logger.warn(`keyBy function ${name} returned ${value === '' ? 'an empty string' : typeof value}; using the IP bucket`);
    } catch (error) {
      this.logger.warn(`keyBy function ${name} ${failure(error)}; using the IP bucket`);
    }
    return ipWho(hooks.getIp(request));
  }

  /** A hook's answer, or a `RateLimitTimeoutError` once it has taken `timeoutMs`: a hung lookup must not hang the request. */
  private bounded<T>(answer: T | PromiseLike<T>): T | Promise<T> {
    const thenable = typeof (answer as PromiseLike<T> | null)?.then === 'function';
    return thenable ? this.hookDeadlines.race(Promise.resolve(answer)) : (answer as T);
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

  private guardRanTwice(plan: RoutePlan, first: object | undefined, second: object): void {
    const name = (guard: object | undefined) => (guard === undefined ? 'none' : guard.constructor.name);
    this.once(
      `twice|${plan.route}`,
      `Two rate-limit guards run on ${plan.route} (${name(first)}, then ${name(second)}): only the first decides. ` +
        'When you register RateLimitGuard (or a subclass) yourself, set RateLimitModule.forRoot({ guard: false })',
    );
  }

  /**
   * With `guard: false`, a limited route on which neither `RateLimitGuard` nor `RateLimitInterceptor`
   * runs would not be limited at all: refuse to start, naming the routes.
   */
  private assertEveryLimitedRouteRuns(): void {
    const global = [...this.config.getGlobalGuards(), ...this.config.getGlobalInterceptors()];
    if (global.some(isOurs)) return;
    const unlimited: string[] = [];
    for (const { controller, handler, plan } of this.registry.routes()) {
      if (plan === null) continue;
      const kind = handlerKind(handler);
      if (kind === 'ws' || kind === 'rpc') continue; // each has RateLimitInterceptor of its own (TransportHandlers)
      const enhancers = [GUARDS_METADATA, INTERCEPTORS_METADATA].flatMap((key) => [
        ...(Reflect.getMetadata(key, controller) ?? []),
        ...(Reflect.getMetadata(key, handler) ?? []),
      ]);
      if (!enhancers.some(isOurs)) unlimited.push(plan.route);
    }
    if (unlimited.length === 0) return;
    throw new Error(
      `RateLimitModule.forRoot({ guard: false }), but no RateLimitGuard runs on ${unlimited.join(', ')}: ` +
        'their @RateLimit policies would not be enforced. Register RateLimitGuard (APP_GUARD, ' +
        'app.useGlobalGuards() or @UseGuards()) or remove guard: false',
    );
  }

  /**
   * Each `forRoot()` brings its own guard, store and connection: a second one would count every request
   * twice, against settings nobody can tell apart.
   */
  private assertImportedOnce(): void {
    const modules = [...this.modules.values()];
    const hosts = modules.filter((module) => module.providers.has(RouteLimiter));
    if (hosts.length < 2) return;
    const importers = modules
      .filter((module) => [...module.imports].some((imported) => hosts.includes(imported)))
      .map((module) => module.metatype?.name ?? '(unnamed module)');
    throw new Error(
      `RateLimitModule.forRoot() / forRootAsync() is imported ${hosts.length} times (by ${importers.join(', ')}): ` +
        'each import registers its own guard and Redis connection, so requests would be limited twice. Import it ' +
        'once, in your root module, and add isGlobal: true to inject BucketService in other modules',
    );
  }

  private once(key: string, message: string): void {
    if (this.said.has(key)) return;
    this.said.add(key);
    this.setupLogger.warn(message);
  }
}

/** A guard or interceptor of this library (a class or an instance, subclasses included). */
function isOurs(enhancer: unknown): boolean {
  const type = typeof enhancer === 'function' ? enhancer : (enhancer as object | null)?.constructor;
  return typeof type === 'function' && RATE_LIMIT_ENHANCER in type;
}

function newState(plan: RoutePlan, hooks: RequestHooks, owner: object | undefined, kind: CallKind): RequestState {
  return {
    kind,
    plan,
    hooks,
    owner,
    before: undefined,
    after: undefined,
    settled: false,
    exempt: undefined,
    refunded: false,
    policies: [],
    verdict: undefined,
    shadow: undefined,
  };
}

/** A phase with nothing to decide. */
const NOTHING: PhaseTake = { enforced: undefined, shadow: undefined };

function newDecided(): Decided {
  return { policies: [], requests: [], positions: [], verdict: undefined as unknown as Verdict };
}

function ipWho(address: string | undefined): Who {
  // routeIdentity({ ip }) is ipIdentity: called directly on the hot path, without the object.
  const id = ipIdentity(address);
  return { kind: 'ip', value: id.slice(3), id };
}

/**
 * Both phases' decisions as one, in the order the route's policies are written. When both phases
 * decided every policy as written, the route's own list is reused (its header text is built once).
 */
function mergeDecided(plan: RoutePlan, before: Decided, after: Decided): Decided {
  const allowed = before.verdict.allowed && after.verdict.allowed;
  const source = SOURCE_RANK[before.verdict.source] >= SOURCE_RANK[after.verdict.source] ? before.verdict.source : after.verdict.source;
  const parts = [...before.verdict.decisions, ...after.verdict.decisions];
  const positions = [...before.positions, ...after.positions];
  const requests = [...before.requests, ...after.requests];
  if (before.policies === plan.beforeGuards && after.policies === plan.afterGuards) {
    const decisions = new Array(plan.policies.length);
    plan.order.forEach((position, i) => (decisions[position] = parts[i]));
    return { policies: plan.policies as CompiledPolicy[], requests, positions, verdict: { allowed, source, decisions } };
  }
  const policies = [...before.policies, ...after.policies];
  const order = positions.map((_, i) => i).sort((x, y) => positions[x] - positions[y]);
  return {
    policies: order.map((i) => policies[i]),
    requests: order.map((i) => requests[i]),
    positions: order.map((i) => positions[i]),
    verdict: { allowed, source, decisions: order.map((i) => parts[i]) },
  };
}

/** The status of a response the handler has not sent yet (Express `res`, Fastify `reply`). */
function statusOf(response: any): number {
  const status = response?.statusCode;
  return typeof status === 'number' ? status : 200;
}

function headersSent(response: any): boolean {
  return response?.headersSent === true || response?.sent === true;
}

/** The wait the 429 announces: the longest of the buckets that refused. */
export function longestWait(verdict: Verdict): number {
  let seconds = 0;
  for (const decision of verdict.decisions) if (decision.retryAfterSeconds > seconds) seconds = decision.retryAfterSeconds;
  return seconds;
}

/** What went wrong with a hook, for the log: it timed out, or it threw. */
function failure(error: unknown): string {
  return error instanceof RateLimitTimeoutError ? 'did not answer within timeoutMs' : `threw (${describeError(error)})`;
}

function describeError(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
