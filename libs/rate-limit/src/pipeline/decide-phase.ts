import type { ExecutionContext } from '@nestjs/common';
import type { BucketService } from '../bucket/bucket.service.js';
import { ipIdentity, routeKey } from '../keys/identity-keys.js';
import type { ControlState } from '../operations/control/control-state.js';
import type { LiveOperations } from '../operations/live-operations.js';
import type { BlockEntry, OverrideEntry } from '../operations/operations.types.js';
import type { CompiledConcurrency } from '../policies/concurrency-option.js';
import type { CompiledPolicy } from '../policies/policy.js';
import type { Verdict } from '../rate-limit.interfaces.js';
import type { ResolvedRateLimitOptions } from '../rate-limit.options.js';
import type { BucketRequest } from '../stores/token-bucket.js';
import type { HookAnswers } from './hook-answers.js';
import type { Identities } from './identity.js';
import type { PolicyNumbers } from './policy-numbers.js';
import { PriorityLevels } from './priority-level.js';
import { type Decided, newDecided, NOTHING, type PhaseTake, type RequestState } from './request-state.js';
import type { RequestVerdicts } from './verdict.js';

/** One phase's policies, decided: what is skipped, whose buckets, with which numbers, and the store's verdict. */
export class PhaseDecider {
  /** Requests' priority levels, from each policy's `priority` (issue 36). */
  private readonly priorities = new PriorityLevels();

  constructor(
    private readonly options: ResolvedRateLimitOptions,
    private readonly hooks: HookAnswers,
    private readonly identities: Identities,
    private readonly numbers: PolicyNumbers,
    private readonly buckets: BucketService,
    private readonly verdicts: RequestVerdicts,
    /** Overrides and blocks in force, and the analytics' counts (`operations`); off: nothing is read. */
    private readonly live: LiveOperations,
  ) {}

  /**
   * Decides one phase's policies: skips what `skipIf` and the allow-list exempt, computes per-request
   * numbers, and asks the store once for the enforced policies and once (at the same time) for the
   * shadow ones. `offset` is the phase's first position in `plan.order`; `plainPhase`, whether the
   * policies take the plain path (`RoutePlan.plainBefore` / `plainAfter`, decided with the plan).
   * `concurrency`: the route's `@ConcurrencyLimit`, in phase 2: its slot is taken in the same store call
   * as the enforced policies where one call can decide both (`withSlot`).
   */
  async decide(
    context: ExecutionContext,
    state: RequestState,
    request: any,
    policies: readonly CompiledPolicy[],
    offset: number,
    plainPhase: boolean,
    concurrency?: CompiledConcurrency,
  ): Promise<PhaseTake> {
    const { plan, hooks } = state;
    if (policies.length === 0) return NOTHING;
    if (this.options.skipIf !== undefined && (await this.hooks.says(this.options.skipIf, context, 'skipIf (module)'))) return NOTHING;
    // Overrides and blocks in force: one property read while there are none.
    const control: ControlState | undefined = this.live.control.active ? this.live.control : undefined;
    const counts = this.live.counts;
    const plain = control === undefined && plainPhase;
    const enforced = newDecided();
    let shadow: Decided | undefined;
    const enforcedIds: string[] | undefined = counts !== undefined ? [] : undefined;
    let shadowIds: string[] | undefined;
    const now = control !== undefined ? Date.now() : 0;
    // A blocked address or range refuses the request whatever its policies key by.
    let blocked: BlockEntry | undefined = control?.blockOf(ipIdentity(hooks.getIp(request)), now);
    for (let i = 0; i < policies.length; i++) {
      let policy = policies[i];
      if (policy.skipIf !== undefined && (await this.hooks.says(policy.skipIf, context, `skipIf of ${policy.scope}`))) continue;
      const found = this.identities.of(context, request, plan, policy, hooks);
      const who = 'then' in found ? await found : found;
      if (!plain && this.identities.allowListed(who)) continue;
      if (policy.dynamic !== undefined) {
        const numbers = await this.numbers.numbersOf(context, plan.route, policy, who);
        policy = { ...policy, capacity: numbers.capacity, refillPerSecond: numbers.refillPerSecond, cost: numbers.cost };
      }
      if (control !== undefined) {
        blocked ??= control.blockOf(who.id, now);
        const override = control.overrideOf(policy.scope, who.id, now);
        if (override !== undefined) policy = overridden(policy, override);
      }
      const into = policy.enforce ? enforced : (shadow ??= newDecided());
      if (counts !== undefined) (policy.enforce ? enforcedIds! : (shadowIds ??= [])).push(who.id);
      into.policies.push(policy);
      into.positions.push(plan.order[offset + i]);
      into.requests.push({
        key: routeKey(this.options.keyPrefix, who.id, policy.keySuffix),
        capacity: policy.capacity,
        refillPerSecond: policy.refillPerSecond,
        cost: policy.cost,
        blockSeconds: policy.blockSeconds,
        penaltyCost: policy.penaltyCost,
        lease: policy.lease,
      });
      // A priority below critical leaves its reserve: the floor rides with the take, decided in the same call.
      if (policy.priority !== undefined) {
        const floor = this.priorities.floorOf(policy.priority, context, policy.scope, policy.capacity);
        if (floor > 0) into.requests[into.requests.length - 1].floor = floor;
      }
    }
    if (blocked !== undefined) return this.blocked(enforced, shadow, blocked, enforcedIds, shadowIds, now);
    const hasEnforced = enforced.requests.length > 0;
    if (plain) {
      // Every policy decided as written: keep the route's own list, whose header text is built once.
      enforced.policies = policies as CompiledPolicy[];
      enforced.verdict = await this.withSlot(context, state, request, enforced.requests, concurrency);
      if (counts !== undefined) record(counts, enforced, enforcedIds!);
      return { enforced, shadow: undefined };
    }
    // With shadow policies, the slot is taken apart: they are decided after the enforced ones.
    if (hasEnforced)
      enforced.verdict = await this.withSlot(context, state, request, enforced.requests, shadow === undefined ? concurrency : undefined);
    if (counts !== undefined && hasEnforced) record(counts, enforced, enforcedIds!);
    // Shadow policies drain what they would once enforced: nothing on a request that the enforced ones,
    // or the shadow ones of the phase before, refuse (enforced, they would not be reached).
    const reached = (!hasEnforced || enforced.verdict.allowed) && state.before?.shadow?.verdict.allowed !== false;
    if (shadow !== undefined && !reached) shadow = undefined;
    if (shadow !== undefined) {
      shadow.verdict = await this.buckets.decide(shadow.requests);
      if (!shadow.verdict.allowed) this.verdicts.shadowRefused(plan, shadow);
      if (counts !== undefined) record(counts, shadow, shadowIds!);
    }
    return { enforced: hasEnforced ? enforced : undefined, shadow };
  }

  /**
   * The enforced policies' verdict, and the route's slot with it in the same store call when there is
   * one to take without a wait, the store can, no bucket is leased (a lease answers without the store),
   * and the identity is not allow-listed: the slot is left in `state.slotTaken` for `RouteSlots`.
   * Otherwise the policies alone; `RouteSlots` then takes the slot in a call of its own.
   */
  private async withSlot(
    context: ExecutionContext,
    state: RequestState,
    request: any,
    requests: readonly BucketRequest[],
    limit: CompiledConcurrency | undefined,
  ): Promise<Verdict> {
    const slots = this.buckets.slots;
    if (
      limit === undefined ||
      requests.length === 0 ||
      limit.maxWaitMs > 0 ||
      !slots.combines ||
      requests.some((r) => r.lease !== undefined)
    ) {
      return this.buckets.decide(requests);
    }
    const found = this.identities.of(context, request, state.plan, limit, state.hooks);
    const who = 'then' in found ? await found : found;
    if (this.identities.allowListed(who)) return this.buckets.decide(requests);
    const taken = await slots.takeWith(requests, {
      key: routeKey(this.options.keyPrefix, who.id, limit.keySuffix),
      scope: limit.scope,
      limit: limit.limit,
      leaseMs: limit.leaseMs,
      maxWaitMs: 0,
      failureMode: this.options.failureMode,
    });
    if (taken.slot !== undefined) state.slotTaken = { slot: taken.slot, untaken: taken.untaken };
    return taken.verdict;
  }

  /**
   * A request whose identity (or address) is blocked: refused before any bucket, every policy of the
   * phase with it (shadow ones too: a block is the operator's, not a policy's), the wait until the block ends.
   */
  private blocked(
    enforced: Decided,
    shadow: Decided | undefined,
    block: BlockEntry,
    enforcedIds: string[] | undefined,
    shadowIds: string[] | undefined,
    now: number,
  ): PhaseTake {
    const all = newDecided();
    for (const part of shadow === undefined ? [enforced] : [enforced, shadow]) {
      all.policies.push(...part.policies);
      all.requests.push(...part.requests);
      all.positions.push(...part.positions);
    }
    const wait = Math.max(1, Math.ceil((block.until - now) / 1000));
    const verdict: Verdict = {
      allowed: false,
      source: 'blocked',
      decisions: all.policies.map((p) => ({
        allowed: false,
        limit: p.capacity,
        remaining: 0,
        retryAfterSeconds: wait,
        resetSeconds: wait,
      })),
    };
    all.verdict = verdict;
    const counts = this.live.counts;
    if (counts !== undefined) record(counts, all, [...(enforcedIds ?? []), ...(shadowIds ?? [])]);
    return { enforced: all, shadow: undefined };
  }
}

/** A policy with an override's numbers and mode; a fixed cost larger than the new capacity is capped at it. */
function overridden(policy: CompiledPolicy, override: OverrideEntry): CompiledPolicy {
  const capacity = override.capacity ?? policy.capacity;
  return {
    ...policy,
    capacity,
    refillPerSecond: override.refillPerSecond ?? policy.refillPerSecond,
    enforce: override.enforce ?? policy.enforce,
    cost: Math.min(policy.cost, capacity),
  };
}

/**
 * Counts a phase's decisions for the analytics: allowed for every policy of an allowed verdict; refused
 * for each policy that refused (its wait > 0), or every one when the store could not decide or a block did.
 */
function record(counts: { record(scope: string, id: string, allowed: boolean): void }, decided: Decided, ids: readonly string[]): void {
  const { verdict, policies } = decided;
  const all = verdict.source === 'blocked' || verdict.source === 'closed';
  for (let i = 0; i < policies.length; i++) {
    if (verdict.allowed) counts.record(policies[i].scope, ids[i], true);
    else if (all || verdict.decisions[i].retryAfterSeconds > 0) counts.record(policies[i].scope, ids[i], false);
  }
}
