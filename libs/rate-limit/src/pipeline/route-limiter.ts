import { type CallHandler, type ExecutionContext, Inject, Injectable } from '@nestjs/common';
import { ApplicationConfig, HttpAdapterHost, ModuleRef } from '@nestjs/core';
import type { Observable } from 'rxjs';
import { BucketService } from '../bucket/bucket.service.js';
import { ClientAddresses } from '../contexts/client-address.js';
import { type LimitedCall, limitedCall } from '../contexts/limited-call.js';
import { RateLimitEvents } from '../events/rate-limit-events.js';
import { RateLimitHeadersWriter } from '../headers/rate-limit-headers.writer.js';
import { LiveOperations } from '../operations/live-operations.js';
import type { CompiledConcurrency } from '../policies/concurrency-option.js';
import { PolicyRegistry, type RoutePlan } from '../policies/policy-registry.js';
import { RATE_LIMIT_GUARD_REPLACED, RATE_LIMIT_VERDICT } from '../rate-limit.constants.js';
import { RATE_LIMIT_OPTIONS } from '../rate-limit.module-definition.js';
import type { ResolvedRateLimitOptions } from '../rate-limit.options.js';
import { ThrottledLogger } from '../throttled-logger.js';
import { PhaseDecider } from './decide-phase.js';
import { HookAnswers } from './hook-answers.js';
import { Identities } from './identity.js';
import { PolicyNumbers } from './policy-numbers.js';
import { Refunds } from './refunds.js';
import { Refusals } from './refusals.js';
import { RouteSlots } from './route-slots.js';
import { newState, type PhaseTake, type RequestHooks, type RequestState } from './request-state.js';
import { SetupWarnings } from './setup-warnings.js';
import { RequestVerdicts } from './verdict.js';

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
 * 3. **After the handler** (`RateLimitInterceptor`): the tokens of policies whose `refundOn` matches the
 *    outcome go back.
 *
 * Headers of an allowed response are written once the route's verdict is final: by the guard when no
 * policy is left for phase 2, else by the interceptor.
 *
 * Each phase is one store call (one atomic script per identity group on a Cluster). The steps of a
 * phase are each in a file of their own, called in order: `PhaseDecider` (skips, `Identities`, numbers,
 * the store), `RequestVerdicts` (the merged verdict and its events), `Refusals`, `Refunds`.
 */
@Injectable()
export class RouteLimiter {
  /** Identities as the module options define them, and the refusal of the call's transport; `RateLimitGuard` subclasses override them. */
  readonly defaultHooks: RequestHooks;
  /** Per-request numbers (and their resolvers, which the start-up checks build). */
  readonly numbers: PolicyNumbers;
  /** Set-up mistakes, said once each. */
  readonly warnings: SetupWarnings;
  /** WebSocket clients' addresses, with the app's trust-proxy setting. */
  private readonly addresses: ClientAddresses;
  private readonly identities: Identities;
  private readonly phase: PhaseDecider;
  private readonly verdicts: RequestVerdicts;
  private readonly refusals: Refusals;
  private readonly refunds: Refunds;
  private readonly slots: RouteSlots;
  /** The calls (their carriers) whose slot an earlier run of the interceptor takes. */
  private readonly slotted = new WeakSet<object>();

  constructor(
    private readonly registry: PolicyRegistry,
    buckets: BucketService,
    private readonly headers: RateLimitHeadersWriter,
    @Inject(RATE_LIMIT_OPTIONS) options: ResolvedRateLimitOptions,
    config: ApplicationConfig,
    events: RateLimitEvents,
    moduleRef: ModuleRef,
    /** A test replaced the module's guard (`overrideGuard(RateLimitGuard)`): what it left undecided stays so. */
    @Inject(RATE_LIMIT_GUARD_REPLACED) private readonly guardReplaced: boolean,
    live: LiveOperations,
  ) {
    // One logger for the app's hooks that fail (skipIf, keys, keyBy functions, refundOn): throttled together.
    const logger = new ThrottledLogger('RateLimit');
    const hooks = new HookAnswers(options.timeoutMs, logger);
    this.warnings = new SetupWarnings(config, options);
    this.addresses = new ClientAddresses(() => moduleRef.get(HttpAdapterHost, { strict: false }));
    this.numbers = new PolicyNumbers(moduleRef, hooks.deadlines, options.resolverCacheMs, (key, message) =>
      this.warnings.once(key, message),
    );
    this.identities = new Identities(options, this.addresses, hooks, this.warnings, logger);
    this.verdicts = new RequestVerdicts(events);
    this.phase = new PhaseDecider(options, hooks, this.identities, this.numbers, buckets, this.verdicts, live);
    this.refusals = new Refusals(headers, options.timeoutMs, options.operations.blockedStatus);
    this.refunds = new Refunds(buckets, headers, this.verdicts, logger);
    this.slots = new RouteSlots(options, this.identities, buckets, headers, this.refusals, this.refunds, events);
    this.defaultHooks = { ...this.identities.defaults, throwRateLimitException: this.refusals.throwRateLimited };
  }

  /**
   * Phase 1, in `RateLimitGuard`. `owner` is the guard instance: a second guard on the same request decides nothing.
   * The route's plan first (an unlimited route stops there), then the call; the set-up warnings only where
   * the call may have one to say, each a bit of the plan once said.
   */
  beforeGuards(context: ExecutionContext, hooks: RequestHooks, owner: object): boolean | Promise<boolean> {
    const plan = this.registry.planFor(context.getClass(), context.getHandler());
    if (plan === null) return true;
    const call = limitedCall(context, this.addresses);
    if (call === undefined) return this.warnings.undecided(context, plan);
    const existing: RequestState | undefined = call.carrier[RATE_LIMIT_VERDICT];
    if (existing !== undefined) {
      if (existing.owner !== owner) this.warnings.guardRanTwice(plan, existing.owner, owner);
      return true;
    }
    if (call.response === undefined) this.warnings.noResponse(call, plan);
    const state = newState(plan, hooks, owner, call.kind);
    call.carrier[RATE_LIMIT_VERDICT] = state;
    if (this.identities.isExempt(state, call.request)) return true;
    if (plan.beforeGuards.length === 0) return true;
    return this.decideBefore(context, state, call.request, call.response).then(() => true);
  }

  /**
   * `RateLimitInterceptor`: phase 2 before the handler runs, then the refunds by outcome after it. The
   * call is read once for both.
   */
  aroundHandler(context: ExecutionContext, next: CallHandler): Observable<unknown> | Promise<Observable<unknown>> {
    const call = limitedCall(context, this.addresses);
    const limit = call === undefined ? undefined : this.concurrencyOf(context, call);
    // The interceptor may run more than once on a request (module defaults put it on globally, a
    // controller-level policy on the class, the handler's decorator on the method): the first, outermost
    // run takes the slot around all the others; a second slot of the same request would halve the limit.
    if (limit !== undefined && !this.slotted.has(call!.carrier)) {
      this.slotted.add(call!.carrier);
      // Phase 2 and the slot are decided once the handler's stream is subscribed to: the subscription owns the slot.
      return this.slots.around(
        context,
        call!,
        limit,
        () => this.afterGuards(context, call),
        () => this.afterHandler(call, next.handle()),
      );
    }
    const decided = this.afterGuards(context, call);
    return decided === undefined ? this.afterHandler(call, next.handle()) : decided.then(() => this.afterHandler(call, next.handle()));
  }

  /** The route's `@ConcurrencyLimit`, from the guard's state or the plan. */
  private concurrencyOf(context: ExecutionContext, call: LimitedCall): CompiledConcurrency | undefined {
    const state: RequestState | undefined = call.carrier[RATE_LIMIT_VERDICT];
    if (state !== undefined) return state.plan.concurrency;
    return this.registry.planFor(context.getClass(), context.getHandler())?.concurrency;
  }

  /**
   * Phase 2, before the handler runs. Undefined when there is nothing to wait for. When the guard
   * decided phase 1, its state holds the route's plan: the plan is looked up only when no guard ran.
   */
  private afterGuards(context: ExecutionContext, call: LimitedCall | undefined): Promise<void> | undefined {
    const state: RequestState | undefined = call?.carrier[RATE_LIMIT_VERDICT];
    if (state !== undefined) {
      if (state.settled) return undefined;
      state.settled = true;
      if (state.exempt) return undefined;
      return this.decideAfter(context, state, call!.request, call!.response);
    }
    const plan = this.registry.planFor(context.getClass(), context.getHandler());
    if (plan === null) return undefined;
    if (call === undefined) {
      this.warnings.undecided(context, plan);
      return undefined;
    }
    if (this.guardReplaced) return undefined;
    // No RateLimitGuard ran. WebSocket and microservice handlers have the interceptor of their own (the
    // global guard may not reach them: connectMicroservice() without inheritAppConfig); nothing to warn about.
    if (plan.beforeGuards.length > 0 && (call.kind === 'http' || call.kind === 'graphql')) this.warnings.noGuard(plan);
    if (call.response === undefined) this.warnings.noResponse(call, plan);
    return this.withoutGuard(context, plan, call);
  }

  /**
   * After the handler: gives back the tokens of policies whose `refundOn` matches the outcome, before
   * the response is sent, and updates its headers. `stream` unchanged when nothing on the request can be refunded.
   */
  private afterHandler(call: LimitedCall | undefined, stream: Observable<unknown>): Observable<unknown> {
    if (call === undefined) return stream;
    const state: RequestState | undefined = call.carrier[RATE_LIMIT_VERDICT];
    if (state === undefined || !state.plan.refunds || state.refunded) return stream;
    return this.refunds.byOutcome(state, call, stream);
  }

  /** No `RateLimitGuard` ran (`guard: false` and none placed on this route): both phases here (`afterGuards` said so, once). */
  private async withoutGuard(context: ExecutionContext, plan: RoutePlan, call: LimitedCall): Promise<void> {
    const { request, response } = call;
    const state = newState(plan, this.defaultHooks, undefined, call.kind);
    call.carrier[RATE_LIMIT_VERDICT] = state;
    if (this.identities.isExempt(state, request)) return;
    if (plan.beforeGuards.length > 0) await this.decideBefore(context, state, request, response);
    if (state.settled) return;
    state.settled = true;
    return this.decideAfter(context, state, request, response);
  }

  private async decideBefore(context: ExecutionContext, state: RequestState, request: any, response: unknown): Promise<void> {
    const { plan } = state;
    const take = await this.phase.decide(context, state, request, plan.beforeGuards, 0, plan.plainBefore);
    state.before = take;
    this.verdicts.publish(state, take, undefined, context);
    const verdict = take.enforced?.verdict;
    if (verdict !== undefined && !verdict.allowed) this.refusals.refuse(context, response, state, verdict);
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
      take = await this.phase.decide(
        context,
        state,
        request,
        plan.afterGuards,
        plan.beforeGuards.length,
        plan.plainAfter,
        plan.concurrency,
      );
    } catch (error) {
      // A 400 for a cost, a 500 for numbers nobody can compute: the request is refused, so phase 1 takes
      // nothing either, its shadow policies included (enforced, they would have been given back too).
      if (first?.verdict.allowed) first.verdict = await this.refunds.giveBack(first);
      const shadowFirst = state.before?.shadow;
      if (shadowFirst?.verdict.allowed) shadowFirst.verdict = await this.refunds.giveBack(shadowFirst);
      throw error;
    }
    state.after = take;
    const after = take.enforced;
    if (after !== undefined && !after.verdict.allowed && first !== undefined && first.verdict.allowed) {
      first.verdict = await this.refunds.giveBack(first);
    }
    // Phase 1's shadow tokens go back when the request is refused after all, as enforced ones would.
    const shadowFirst = state.before?.shadow;
    if (shadowFirst?.verdict.allowed && (after?.verdict.allowed === false || take.shadow?.verdict.allowed === false)) {
      shadowFirst.verdict = await this.refunds.giveBack(shadowFirst);
    }
    this.verdicts.publish(state, state.before, take, context);
    const verdict = state.verdict;
    if (verdict === undefined) return;
    if (!verdict.allowed) this.refusals.refuse(context, response, state, verdict);
    this.headers.write(response, state.policies, verdict);
  }
}
