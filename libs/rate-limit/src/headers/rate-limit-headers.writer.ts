import { Inject, Injectable } from '@nestjs/common';
import type { Verdict } from '../rate-limit.interfaces.js';
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

/** Sets a header on a Node response (Express) or a Fastify reply. */
function setHeader(response: HeaderTarget, name: string, value: string): void {
  // Express's res.header() adds nothing but work on top of Node's setHeader for these names.
  if (typeof response.setHeader === 'function') response.setHeader(name, value);
  else response.header?.(name, value);
}

function canSetHeaders(response: HeaderTarget | undefined | null): boolean {
  return typeof response?.setHeader === 'function' || typeof response?.header === 'function';
}

/** What the headers say about a route's policies that never changes: built once per route. */
interface PolicyText {
  /** draft-6 and draft-7 `RateLimit-Policy` of each policy: `B;w=<window>`. */
  policy: string[];
  /** draft-8 `RateLimit-Policy` of all of them. */
  draft8Policy: string;
  /** draft-8 `"<scope>";r=` of each policy. */
  draft8Names: string[];
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
 * Writes the rate-limit headers for a verdict: the guard calls it for allowed requests and before it
 * throws the 429, so both carry the same fields.
 */
@Injectable()
export class RateLimitHeadersWriter {
  /** Keyed by a route's policy list, which the registry builds once per route. */
  private readonly texts = new WeakMap<readonly HeaderPolicy[], PolicyText>();

  constructor(@Inject(RATE_LIMIT_OPTIONS) private readonly options: ResolvedRateLimitOptions) {}

  write(response: unknown, policies: readonly HeaderPolicy[], verdict: Verdict): void {
    // An allowance made without the store (failureMode 'open') knows no numbers worth sending.
    if (verdict.source === 'open' || verdict.source === 'closed') return;
    const target = response as HeaderTarget;
    // A call without an HTTP response (a GraphQL subscription) has no headers to carry them.
    if (!canSetHeaders(target)) return;
    const { decisions, allowed } = verdict;
    const text = this.textOf(policies);
    const i = decisions.length === 1 ? 0 : mostRestrictive(decisions, allowed);
    const decision = decisions[i];
    const limit = String(decision.limit);
    const remaining = String(decision.remaining);
    const reset = String(decision.resetSeconds);
    if (this.options.legacyHeaders) {
      setHeader(target, HEADERS.legacyLimit, limit);
      setHeader(target, HEADERS.legacyRemaining, remaining);
      setHeader(target, HEADERS.legacyReset, reset);
    }
    switch (this.options.standardHeaders) {
      case 'draft-6':
        setHeader(target, HEADERS.limit, limit);
        setHeader(target, HEADERS.remaining, remaining);
        setHeader(target, HEADERS.reset, reset);
        setHeader(target, HEADERS.policy, text.policy[i]);
        break;
      case 'draft-7':
        setHeader(target, HEADERS.combined, `limit=${limit}, remaining=${remaining}, reset=${reset}`);
        setHeader(target, HEADERS.policy, text.policy[i]);
        break;
      case 'draft-8': {
        setHeader(target, HEADERS.policy, text.draft8Policy);
        let combined = '';
        for (let j = 0; j < decisions.length; j++) {
          combined += `${j > 0 ? ', ' : ''}${text.draft8Names[j]}${decisions[j].remaining};t=${decisions[j].resetSeconds}`;
        }
        setHeader(target, HEADERS.combined, combined);
        break;
      }
    }
    if (!allowed) setHeader(target, HEADERS.retryAfter, String(decision.retryAfterSeconds));
  }

  /**
   * A concurrency limit's headers (`@ConcurrencyLimit`): the most in flight and how many are, this
   * request included when it holds a slot; `Retry-After` (a hint) when refused. Sent when any headers are.
   */
  writeConcurrency(response: unknown, limit: number, inFlight: number, retryAfter: number | undefined): void {
    if (this.options.standardHeaders === false && !this.options.legacyHeaders) return;
    const target = response as HeaderTarget & { headersSent?: boolean; sent?: boolean };
    // An SSE response's headers may be out before the interceptors answer (Nest commits them early).
    if (!canSetHeaders(target) || target.headersSent === true || target.sent === true) return;
    setHeader(target, HEADERS.concurrencyLimit, String(limit));
    setHeader(target, HEADERS.concurrencyInFlight, String(inFlight));
    if (retryAfter !== undefined) setHeader(target, HEADERS.retryAfter, String(retryAfter));
  }

  /** `Retry-After` alone, for a 503 when the store cannot decide and failureMode is 'closed'. */
  writeRetryAfter(response: unknown, seconds: number): void {
    if (canSetHeaders(response as HeaderTarget)) setHeader(response as HeaderTarget, HEADERS.retryAfter, String(seconds));
  }

  private textOf(policies: readonly HeaderPolicy[]): PolicyText {
    let text = this.texts.get(policies);
    if (text === undefined) {
      text = {
        policy: policies.map((p) => `${p.capacity};w=${windowSeconds(p)}`),
        draft8Policy: policies.map((p) => `"${p.scope}";q=${p.capacity};w=${windowSeconds(p)}`).join(', '),
        draft8Names: policies.map((p) => `"${p.scope}";r=`),
      };
      this.texts.set(policies, text);
    }
    return text;
  }
}
