import type { ExecutionContext } from '@nestjs/common';
import type { RateLimitEvents } from '../events/rate-limit-events.js';
import type { CompiledPolicy } from '../policies/policy.js';
import type { RoutePlan } from '../policies/policy-registry.js';
import type { Verdict, VerdictSource } from '../rate-limit.interfaces.js';
import { ThrottledLogger } from '../throttled-logger.js';
import type { Decided, PhaseTake, RequestState } from './request-state.js';

/** The source a merged verdict reports: a failure of either phase wins, so headers never claim numbers nobody has. */
const SOURCE_RANK: Record<VerdictSource, number> = { store: 0, cache: 1, local: 2, open: 3, closed: 4, blocked: 5 };

/** The request's verdict over both phases, left on the request (`RateLimitState`), and its decision events. */
export class RequestVerdicts {
  /** What shadow policies would have refused: logged apart, so that failures do not hide it. */
  private readonly shadowLogger = new ThrottledLogger('RateLimit');

  constructor(private readonly events: RateLimitEvents) {}

  /** The state after a phase: the enforced policies and verdict so far (both phases merged), the shadow ones, and the events. */
  publish(state: RequestState, before: PhaseTake | undefined, after: PhaseTake | undefined, context: ExecutionContext | undefined): void {
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

  /** A shadow policy would have refused: the request went on (`enforce: false`), and the log says which policy. */
  shadowRefused(plan: RoutePlan, shadow: Decided): void {
    const short = shadow.policies.filter((_, i) => shadow.verdict.decisions[i].retryAfterSeconds > 0).map((p) => p.scope);
    this.shadowLogger.warn(
      `Shadow policy ${short.join(', ') || shadow.policies.map((p) => p.scope).join(', ')} on ${plan.route} would have refused a request ` +
        `(retry after ${longestWait(shadow.verdict)} s); it went on (enforce: false)`,
    );
  }
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

/** The wait the 429 announces: the longest of the buckets that refused. */
export function longestWait(verdict: Verdict): number {
  let seconds = 0;
  for (const decision of verdict.decisions) if (decision.retryAfterSeconds > seconds) seconds = decision.retryAfterSeconds;
  return seconds;
}
