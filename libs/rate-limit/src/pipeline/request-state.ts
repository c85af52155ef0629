import type { ExecutionContext } from '@nestjs/common';
import type { ConcurrencySlot } from '../bucket/concurrency-slots.js';
import type { CallKind } from '../contexts/limited-call.js';
import type { CompiledPolicy } from '../policies/policy.js';
import type { RoutePlan } from '../policies/policy-registry.js';
import type { Verdict } from '../rate-limit.interfaces.js';
import type { BucketRequest } from '../stores/token-bucket.js';

/**
 * Where a request's identities come from, and what a refusal throws: the module's defaults
 * (`Identities.defaults`), or what a `RateLimitGuard` subclass overrides, handed to the pipeline as data.
 */
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
export interface Decided {
  policies: CompiledPolicy[];
  requests: BucketRequest[];
  positions: number[];
  verdict: Verdict;
}

/** What one phase took: enforced and shadow policies are decided apart (a shadow refusal never refuses). */
export interface PhaseTake {
  enforced: Decided | undefined;
  shadow: Decided | undefined;
}

export interface RequestState extends RateLimitState {
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
  /**
   * The route's concurrency slot, taken in the same store call as phase 2's policies (`PhaseDecider`),
   * until `RouteSlots` adopts it; `untaken`: the slot was refused and the buckets left untouched.
   */
  slotTaken: { slot: ConcurrencySlot; untaken: boolean } | undefined;
}

export function newState(plan: RoutePlan, hooks: RequestHooks, owner: object | undefined, kind: CallKind): RequestState {
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
    slotTaken: undefined,
    policies: [],
    verdict: undefined,
    shadow: undefined,
  };
}

/** A phase with nothing to decide. */
export const NOTHING: PhaseTake = { enforced: undefined, shadow: undefined };

export function newDecided(): Decided {
  return { policies: [], requests: [], positions: [], verdict: undefined as unknown as Verdict };
}
