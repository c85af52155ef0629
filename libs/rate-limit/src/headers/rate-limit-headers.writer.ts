import { Inject, Injectable } from '@nestjs/common';
import type { Verdict } from '../bucket/bucket.service.js';
import { HEADERS } from '../rate-limit.constants.js';
import type { BucketDecision, BucketPolicy } from '../rate-limit.interfaces.js';
import { RATE_LIMIT_OPTIONS } from '../rate-limit.module-definition.js';
import type { ResolvedRateLimitOptions } from '../rate-limit.options.js';

/** A policy as the headers describe it: its numbers and its draft-8 name. */
export interface HeaderPolicy extends BucketPolicy {
  scope: string;
}

type HeaderTarget = {
  header?: (name: string, value: string) => unknown;
  setHeader?: (name: string, value: string) => unknown;
};

/** Sets a header on an Express response or a Fastify reply. */
function setHeader(response: HeaderTarget, name: string, value: string | number): void {
  if (typeof response.header === 'function') response.header(name, String(value));
  else response.setHeader?.(name, String(value));
}

/** The policy the headers describe: the longest wait when denied, the fewest remaining when allowed (ties: the smaller capacity). */
export function mostRestrictive(decisions: readonly BucketDecision[], allowed: boolean): number {
  let chosen = 0;
  for (let i = 1; i < decisions.length; i++) {
    const a = decisions[i];
    const b = decisions[chosen];
    const primary = allowed ? b.remaining - a.remaining : a.retryAfterSeconds - b.retryAfterSeconds;
    if (primary > 0 || (primary === 0 && a.limit < b.limit)) chosen = i;
  }
  return chosen;
}

/** Seconds in which an empty bucket fills: the window the standard headers speak of. */
function windowSeconds(policy: BucketPolicy): number {
  return Math.ceil(policy.capacity / policy.refillPerSecond);
}

/**
 * Writes the rate-limit headers for a verdict; used by the interceptor on allowed responses and by the
 * guard before it throws the 429, so both carry the same fields.
 */
@Injectable()
export class RateLimitHeadersWriter {
  constructor(@Inject(RATE_LIMIT_OPTIONS) private readonly options: ResolvedRateLimitOptions) {}

  write(response: unknown, policies: readonly HeaderPolicy[], verdict: Verdict): void {
    // An allowance made without the store (failureMode 'open') knows no numbers worth sending.
    if (verdict.source === 'open' || verdict.source === 'closed') return;
    const target = response as HeaderTarget;
    const { decisions, allowed } = verdict;
    const i = mostRestrictive(decisions, allowed);
    const decision = decisions[i];
    const policy = policies[i];
    if (this.options.legacyHeaders) {
      setHeader(target, HEADERS.legacyLimit, decision.limit);
      setHeader(target, HEADERS.legacyRemaining, decision.remaining);
      setHeader(target, HEADERS.legacyReset, decision.resetSeconds);
    }
    switch (this.options.standardHeaders) {
      case 'draft-6':
        setHeader(target, HEADERS.limit, decision.limit);
        setHeader(target, HEADERS.remaining, decision.remaining);
        setHeader(target, HEADERS.reset, decision.resetSeconds);
        setHeader(target, HEADERS.policy, `${decision.limit};w=${windowSeconds(policy)}`);
        break;
      case 'draft-7':
        setHeader(
          target,
          HEADERS.combined,
          `limit=${decision.limit}, remaining=${decision.remaining}, reset=${decision.resetSeconds}`,
        );
        setHeader(target, HEADERS.policy, `${decision.limit};w=${windowSeconds(policy)}`);
        break;
      case 'draft-8':
        setHeader(
          target,
          HEADERS.policy,
          policies.map((p) => `"${p.scope}";q=${p.capacity};w=${windowSeconds(p)}`).join(', '),
        );
        setHeader(
          target,
          HEADERS.combined,
          policies.map((p, j) => `"${p.scope}";r=${decisions[j].remaining};t=${decisions[j].resetSeconds}`).join(', '),
        );
        break;
    }
    if (!allowed) setHeader(target, HEADERS.retryAfter, decision.retryAfterSeconds);
  }

  /** `Retry-After` alone, for a 503 when the store cannot decide and failureMode is 'closed'. */
  writeRetryAfter(response: unknown, seconds: number): void {
    setHeader(response as HeaderTarget, HEADERS.retryAfter, seconds);
  }
}
