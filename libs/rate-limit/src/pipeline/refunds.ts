import { HttpException } from '@nestjs/common';
import type { Observable } from 'rxjs';
// From 'rxjs/operators': the 'rxjs' entry point exports operators only since 7.2, and the peer range starts at 7.1.
import { catchError, mergeMap } from 'rxjs/operators';
import type { BucketService } from '../bucket/bucket.service.js';
import type { LimitedCall } from '../contexts/limited-call.js';
import type { RateLimitHeadersWriter } from '../headers/rate-limit-headers.writer.js';
import type { CompiledPolicy } from '../policies/policy.js';
import type { RoutePlan } from '../policies/policy-registry.js';
import type { Verdict } from '../rate-limit.interfaces.js';
import { toDecision } from '../stores/token-bucket.js';
import type { ThrottledLogger } from '../throttled-logger.js';
import { describeError } from './hook-answers.js';
import type { Decided, RequestState } from './request-state.js';
import type { RequestVerdicts } from './verdict.js';

/** Tokens given back: what phase 1 took when phase 2 refuses, and what `refundOn` policies took, after the handler. */
export class Refunds {
  constructor(
    private readonly buckets: BucketService,
    private readonly headers: RateLimitHeadersWriter,
    private readonly verdicts: RequestVerdicts,
    private readonly logger: ThrottledLogger,
  ) {}

  /** Returns what phase 1 took; the verdict it answers describes the buckets after the refund, as refused. */
  async giveBack(take: Decided): Promise<Verdict> {
    const tokens = await this.buckets.giveBack(take.requests, take.verdict.source);
    const decisions = take.requests.map((request, i) =>
      tokens === undefined
        ? { ...take.verdict.decisions[i], allowed: false, retryAfterSeconds: 0 }
        : toDecision(request, tokens[i], request.cost, false),
    );
    return { allowed: false, source: take.verdict.source, decisions };
  }

  /** The handler's outcome, as it leaves `stream`, refunds the policies whose `refundOn` matches it, before the response is sent. */
  byOutcome(state: RequestState, call: LimitedCall, stream: Observable<unknown>): Observable<unknown> {
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
    this.verdicts.publish(state, state.before, state.after, undefined);
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
}

/** The status of a response the handler has not sent yet (Express `res`, Fastify `reply`). */
function statusOf(response: any): number {
  const status = response?.statusCode;
  return typeof status === 'number' ? status : 200;
}

function headersSent(response: any): boolean {
  return response?.headersSent === true || response?.sent === true;
}
