import type { ExecutionContext } from '@nestjs/common';
import type { BucketService } from '../bucket/bucket.service.js';
import { routeKey } from '../keys/identity.js';
import type { CompiledPolicy } from '../policies/policy.js';
import type { ResolvedRateLimitOptions } from '../rate-limit.options.js';
import type { HookAnswers } from './hook-answers.js';
import type { Identities } from './identity.js';
import type { PolicyNumbers } from './policy-numbers.js';
import { type Decided, newDecided, NOTHING, type PhaseTake, type RequestState } from './request-state.js';
import type { RequestVerdicts } from './verdict.js';

/** One phase's policies, decided: what is skipped, whose buckets, with which numbers, and the store's verdict. */
export class PhaseDecider {
  /** Per-policy work beyond the plain path: skips, allow-listed identities, per-request numbers, shadow mode. */
  private readonly plainPolicies = new WeakMap<readonly CompiledPolicy[], boolean>();

  constructor(
    private readonly options: ResolvedRateLimitOptions,
    private readonly hooks: HookAnswers,
    private readonly identities: Identities,
    private readonly numbers: PolicyNumbers,
    private readonly buckets: BucketService,
    private readonly verdicts: RequestVerdicts,
  ) {}

  /**
   * Decides one phase's policies: skips what `skipIf` and the allow-list exempt, computes per-request
   * numbers, and asks the store once for the enforced policies and once (at the same time) for the
   * shadow ones. `offset` is the phase's first position in `plan.order`.
   */
  async decide(
    context: ExecutionContext,
    state: RequestState,
    request: any,
    policies: readonly CompiledPolicy[],
    offset: number,
  ): Promise<PhaseTake> {
    const { plan, hooks } = state;
    if (policies.length === 0) return NOTHING;
    if (this.options.skipIf !== undefined && (await this.hooks.says(this.options.skipIf, context, 'skipIf (module)'))) return NOTHING;
    const plain = this.isPlain(policies);
    const enforced = newDecided();
    let shadow: Decided | undefined;
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
      if (!shadow.verdict.allowed) this.verdicts.shadowRefused(plan, shadow);
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
}
