import {
  type ExecutionContext,
  Inject,
  Injectable,
  Logger,
  type OnApplicationBootstrap,
  type OnModuleInit,
  ServiceUnavailableException,
} from '@nestjs/common';
import { GUARDS_METADATA, INTERCEPTORS_METADATA } from '@nestjs/common/constants.js';
import { ApplicationConfig, ModulesContainer } from '@nestjs/core';
import { BucketService, type Verdict, type VerdictSource } from '../bucket/bucket.service.js';
import { Deadlines, RateLimitTimeoutError } from '../bucket/with-timeout.js';
import { type BucketRequest, toDecision } from '../bucket/token-bucket.js';
import { RateLimitHeadersWriter } from '../headers/rate-limit-headers.writer.js';
import { apiKeyIdentity, createDigest, type Digest, identity, ipIdentity, routeKey } from '../keys/identity.js';
import type { CompiledPolicy } from '../policies/policy.js';
import { PolicyRegistry, type RoutePlan } from '../policies/policy-registry.js';
import { RATE_LIMIT_ENHANCER, RATE_LIMIT_VERDICT } from '../rate-limit.constants.js';
import { RateLimitException } from '../rate-limit.exception.js';
import { RATE_LIMIT_OPTIONS } from '../rate-limit.module-definition.js';
import type { ResolvedRateLimitOptions } from '../rate-limit.options.js';
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
  /** The policies decided so far: those of the guard, then (after the interceptor) all of the route's. */
  policies: readonly CompiledPolicy[];
  /** The verdict over `policies`; undefined while none has been decided. */
  verdict: Verdict | undefined;
}

/** The guard's take, kept so that a refusal after the app's guards can give it back. */
interface GuardTake {
  requests: BucketRequest[];
  verdict: Verdict;
}

interface RequestState extends RateLimitState {
  plan: RoutePlan;
  hooks: RequestHooks;
  /** The guard instance that decided the first phase (`undefined`: the interceptor did, without a guard). */
  owner: object | undefined;
  take: GuardTake | undefined;
  /** The interceptor has run: a second one on the same request does nothing. */
  settled: boolean;
}

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
  /** Mistakes of set-up are logged once per route (and policy), each: they do not repeat per request. */
  private readonly setupLogger = new Logger('RateLimit');
  private readonly said = new Set<string>();
  private readonly hash: Digest;
  /** Identities as the module options define them; `RateLimitGuard` subclasses override them. */
  readonly defaultHooks: RequestHooks;
  /** An asynchronous hook (`keys.apiKey`, a keyBy function) gets `timeoutMs`, like the store. */
  private readonly hookDeadlines: Deadlines;

  constructor(
    private readonly registry: PolicyRegistry,
    private readonly buckets: BucketService,
    private readonly headers: RateLimitHeadersWriter,
    @Inject(RATE_LIMIT_OPTIONS) readonly options: ResolvedRateLimitOptions,
    private readonly modules: ModulesContainer,
    private readonly config: ApplicationConfig,
  ) {
    this.hash = createDigest(options.secret);
    this.hookDeadlines = new Deadlines(options.timeoutMs);
    const apiKeyHeader = options.apiKeyHeader;
    this.defaultHooks = {
      getIp: (request) => request.ip ?? request.socket?.remoteAddress,
      getUserId: options.user ?? ((request) => request.user?.id),
      getApiKey:
        options.apiKey ??
        ((request) => {
          const value = request.headers?.[apiKeyHeader];
          return Array.isArray(value) ? value[0] : value;
        }),
      throwRateLimitException: (_context, verdict) => {
        throw RateLimitException.withoutStack(longestWait(verdict));
      },
    };
  }

  onModuleInit(): void {
    this.assertImportedOnce();
  }

  /** Global guards and interceptors are all known by now, `useGlobalGuards()` ones included. */
  onApplicationBootstrap(): void {
    if (!this.options.guard) this.assertEveryLimitedRouteRuns();
  }

  /** Phase 1, in `RateLimitGuard`. `owner` is the guard instance: a second guard on the same request decides nothing. */
  beforeGuards(context: ExecutionContext, hooks: RequestHooks, owner: object): boolean | Promise<boolean> {
    if (context.getType() !== 'http') return true;
    const plan = this.registry.planFor(context.getClass(), context.getHandler());
    if (plan === null) return true;
    const http = context.switchToHttp();
    const request = http.getRequest();
    const existing: RequestState | undefined = request[RATE_LIMIT_VERDICT];
    if (existing !== undefined) {
      if (existing.owner !== owner) this.guardRanTwice(plan, existing.owner, owner);
      return true;
    }
    const state = newState(plan, hooks, owner);
    request[RATE_LIMIT_VERDICT] = state;
    if (plan.beforeGuards.length === 0) return true;
    return this.decideBefore(context, state, request, http.getResponse()).then(() => true);
  }

  /** Phase 2, in `RateLimitInterceptor`, before the handler runs. Undefined when there is nothing to wait for. */
  afterGuards(context: ExecutionContext): Promise<void> | undefined {
    if (context.getType() !== 'http') return undefined;
    const plan = this.registry.planFor(context.getClass(), context.getHandler());
    if (plan === null) return undefined;
    const http = context.switchToHttp();
    const request = http.getRequest();
    const response = http.getResponse();
    const state: RequestState | undefined = request[RATE_LIMIT_VERDICT];
    if (state === undefined) return this.withoutGuard(context, plan, request, response);
    if (state.settled) return undefined;
    state.settled = true;
    return this.decideAfter(context, state, request, response);
  }

  /** No `RateLimitGuard` ran (`guard: false` and none placed on this route): both phases here, and say so once. */
  private async withoutGuard(context: ExecutionContext, plan: RoutePlan, request: any, response: unknown): Promise<void> {
    if (plan.beforeGuards.length > 0) {
      this.once(
        `noguard|${plan.route}`,
        `No RateLimitGuard ran before ${plan.route} (guard: false?): its policies are decided after your guards, ` +
          'so requests they refuse are not counted. Register RateLimitGuard, or remove guard: false',
      );
    }
    const state = newState(plan, this.defaultHooks, undefined);
    request[RATE_LIMIT_VERDICT] = state;
    if (plan.beforeGuards.length > 0) await this.decideBefore(context, state, request, response);
    if (state.settled) return;
    state.settled = true;
    return this.decideAfter(context, state, request, response);
  }

  private async decideBefore(context: ExecutionContext, state: RequestState, request: any, response: unknown): Promise<void> {
    const { plan } = state;
    const requests = await this.bucketRequests(context, request, plan, plan.beforeGuards, state.hooks);
    const verdict = await this.buckets.decide(requests);
    state.take = { requests, verdict };
    state.policies = plan.beforeGuards;
    state.verdict = verdict;
    if (!verdict.allowed) this.refuse(context, response, state, verdict);
    if (plan.afterGuards.length === 0) {
      // Nothing is left for after the app's guards: the route's verdict is final, and its headers go now.
      state.settled = true;
      this.headers.write(response, state.policies, verdict);
    }
  }

  private async decideAfter(context: ExecutionContext, state: RequestState, request: any, response: unknown): Promise<void> {
    const { plan, take } = state;
    const requests = await this.bucketRequests(context, request, plan, plan.afterGuards, state.hooks);
    const after = await this.buckets.decide(requests);
    let before = take?.verdict;
    if (!after.allowed && take !== undefined && take.verdict.allowed) {
      before = await this.giveBack(take);
    }
    const verdict = before === undefined ? after : merge(plan, before, after);
    state.policies = before === undefined ? plan.afterGuards : plan.policies;
    state.verdict = verdict;
    if (!verdict.allowed) this.refuse(context, response, state, verdict);
    this.headers.write(response, state.policies, verdict);
  }

  /** Returns what phase 1 took; the verdict it answers describes the buckets after the refund, as refused. */
  private async giveBack(take: GuardTake): Promise<Verdict> {
    const tokens = await this.buckets.giveBack(take.requests, take.verdict.source);
    const decisions = take.requests.map((request, i) =>
      tokens === undefined
        ? { ...take.verdict.decisions[i], allowed: false, retryAfterSeconds: 0 }
        : toDecision(request, tokens[i], request.cost, false),
    );
    return { allowed: false, source: take.verdict.source, decisions };
  }

  private refuse(context: ExecutionContext, response: unknown, state: RequestState, verdict: Verdict): never {
    if (verdict.source === 'closed') {
      this.headers.writeRetryAfter(response, Math.max(1, Math.ceil(this.options.timeoutMs / 1000)));
      throw new ServiceUnavailableException('Rate limiting is unavailable; try again shortly');
    }
    this.headers.write(response, state.policies, verdict);
    return state.hooks.throwRateLimitException(context, verdict);
  }

  private async bucketRequests(
    context: ExecutionContext,
    request: any,
    plan: RoutePlan,
    policies: readonly CompiledPolicy[],
    hooks: RequestHooks,
  ): Promise<BucketRequest[]> {
    const requests = new Array<BucketRequest>(policies.length);
    for (let i = 0; i < policies.length; i++) {
      const policy = policies[i];
      const found = this.identityOf(context, request, plan, policy, hooks);
      const id = typeof found === 'string' ? found : await found;
      requests[i] = {
        key: routeKey(this.options.keyPrefix, id, policy.keySuffix),
        capacity: policy.capacity,
        refillPerSecond: policy.refillPerSecond,
        cost: policy.cost,
        blockSeconds: policy.blockSeconds,
      };
    }
    return requests;
  }

  /** The identity whose bucket a policy drains. A missing user or API key, or a failing hook, falls back to the IP. */
  private identityOf(
    context: ExecutionContext,
    request: any,
    plan: RoutePlan,
    policy: CompiledPolicy,
    hooks: RequestHooks,
  ): string | Promise<string> {
    const { keyBy } = policy;
    if (keyBy === 'ip') return ipIdentity(hooks.getIp(request));
    if (keyBy === 'user') {
      let user: unknown;
      try {
        user = hooks.getUserId(request);
      } catch (error) {
        this.logger.warn(`keys.user threw (${describeError(error)}); using the IP bucket`);
      }
      if ((typeof user === 'string' && user !== '') || (typeof user === 'number' && Number.isFinite(user))) {
        return identity('user', String(user), this.hash);
      }
      this.once(
        `nouser|${plan.route}|${policy.scope}`,
        `keyBy 'user' on ${plan.route}${policy.scope === plan.route ? '' : ` (${policy.scope})`} found no user (${this.options.user ? 'keys.user' : 'req.user.id'} ` +
          `gave ${user === '' ? 'an empty string' : String(user)}): those requests are limited by IP. If the route is ` +
          'meant for signed-in users, put your auth guard on it (the policy is decided after it)',
      );
      return ipIdentity(hooks.getIp(request));
    }
    if (keyBy === 'apiKey') return this.apiKeyIdentity(request, hooks);
    return this.functionIdentity(context, request, keyBy, hooks);
  }

  private async apiKeyIdentity(request: any, hooks: RequestHooks): Promise<string> {
    let key: unknown;
    try {
      key = await this.bounded(hooks.getApiKey(request));
    } catch (error) {
      this.logger.warn(`keys.apiKey ${failure(error)}; using the IP bucket`);
    }
    return typeof key === 'string' && key !== '' ? apiKeyIdentity(key, this.hash) : ipIdentity(hooks.getIp(request));
  }

  private async functionIdentity(
    context: ExecutionContext,
    request: any,
    keyBy: (context: ExecutionContext) => string | Promise<string>,
    hooks: RequestHooks,
  ): Promise<string> {
    const name = keyBy.name || '(anonymous)';
    try {
      const value: unknown = await this.bounded(keyBy(context));
      if (typeof value === 'string' && value !== '') return identity('id', value, this.hash);
      this.logger.warn(`keyBy function ${name} returned ${value === '' ? 'an empty string' : typeof value}; using the IP bucket`);
    } catch (error) {
      this.logger.warn(`keyBy function ${name} ${failure(error)}; using the IP bucket`);
    }
    return ipIdentity(hooks.getIp(request));
  }

  /** A hook's answer, or a `RateLimitTimeoutError` once it has taken `timeoutMs`: a hung lookup must not hang the request. */
  private bounded<T>(answer: T | PromiseLike<T>): T | Promise<T> {
    const thenable = typeof (answer as PromiseLike<T> | null)?.then === 'function';
    return thenable ? this.hookDeadlines.race(Promise.resolve(answer)) : (answer as T);
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

function newState(plan: RoutePlan, hooks: RequestHooks, owner: object | undefined): RequestState {
  return { plan, hooks, owner, take: undefined, settled: false, policies: [], verdict: undefined };
}

/** Both phases' verdicts as one, in the order the route's policies are written. */
function merge(plan: RoutePlan, before: Verdict, after: Verdict): Verdict {
  const decisions = new Array(plan.policies.length);
  const parts = [...before.decisions, ...after.decisions];
  plan.order.forEach((position, i) => (decisions[position] = parts[i]));
  const source = SOURCE_RANK[before.source] >= SOURCE_RANK[after.source] ? before.source : after.source;
  return { allowed: before.allowed && after.allowed, source, decisions };
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
