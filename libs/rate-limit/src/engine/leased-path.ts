import type { Verdict, VerdictSource } from '../rate-limit.interfaces.js';
import { type BucketRequest, toDecision } from '../stores/token-bucket.js';
import type { Fallback } from './fallback.js';
import type { LeaseBook, LeaseTake } from './lease-book.js';

/**
 * The decisions of the decision engine that have leased buckets (docs/explanation/leases.md), over this
 * instance's `LeaseBook`: taken from leases here, the rest decided exactly, all or none; and refunds of
 * what was spent from a lease here, back into that lease.
 */
export class LeasedPath {
  constructor(
    private readonly book: LeaseBook,
    /** The engine's exact decision (one store call, deadline, breakers, deny cache, failureMode). */
    private readonly exact: (requests: readonly BucketRequest[], dryRun: boolean) => Promise<Verdict>,
    /** The engine's exact refund of what the store took. */
    private readonly refund: (requests: readonly BucketRequest[]) => Promise<number[] | undefined>,
    private readonly fallback: Fallback,
  ) {}

  /**
   * A decision with leased buckets (docs/explanation/leases.md): each is taken from this instance's
   * lease (a lease call when it has too few tokens), or decided exactly when cold; then the exact ones in
   * one call. All or none: a refusal puts back what was spent from leases here. A lease call that fails
   * sends the whole decision to `failureMode`, as a failed exact call does.
   */
  async decide(requests: readonly BucketRequest[]): Promise<Verdict> {
    const book = this.book;
    const n = requests.length;
    const takes: (LeaseTake | undefined)[] = new Array(n);
    let refused = false;
    let exact: BucketRequest[] | undefined;
    try {
      for (let i = 0; i < n && !refused; i++) {
        const request = requests[i];
        if (request.lease === undefined) continue;
        const found = book.take(request);
        const take = 'then' in found ? await found : found;
        takes[i] = take;
        if (take.kind === 'refused') refused = true;
      }
    } catch {
      this.undo(requests, takes);
      return this.fallback.decide(requests, undefined);
    }
    for (let i = 0; i < n; i++) if (takes[i]?.kind !== 'spent' && takes[i]?.kind !== 'refused') (exact ??= []).push(requests[i]);
    if (refused) {
      this.undo(requests, takes);
      // The buckets not asked are shown as they stand (a peek), so that each decision says whether it had its cost.
      const peeked = exact === undefined ? undefined : await this.exact(exact, true);
      return this.merge(requests, takes, peeked, false, 'store');
    }
    if (exact === undefined) return this.merge(requests, takes, undefined, true, 'store');
    const verdict = await this.exact(exact, false);
    for (let j = 0, i = 0; i < n; i++) {
      if (takes[i] !== undefined && takes[i]!.kind !== 'exact') continue;
      if (requests[i].lease !== undefined && verdict.source === 'store') book.saw(requests[i], exactTokens(verdict, j));
      j++;
    }
    if (!verdict.allowed) this.undo(requests, takes);
    return this.merge(requests, takes, verdict, verdict.allowed, verdict.source);
  }

  /** Puts back what a decision spent from leases here: into the lease when no call was sent for it since, else by an exact refund. */
  private undo(requests: readonly BucketRequest[], takes: readonly (LeaseTake | undefined)[]): void {
    const book = this.book;
    const refunds: BucketRequest[] = [];
    for (let i = 0; i < requests.length; i++) {
      if (takes[i]?.kind !== 'spent') continue;
      if (book.putBack(requests[i]) === undefined) refunds.push(requests[i]);
    }
    if (refunds.length > 0) void this.refund(refunds);
  }

  /** One verdict of the leased takes and the exact verdict of the others (in request order). */
  private merge(
    requests: readonly BucketRequest[],
    takes: readonly (LeaseTake | undefined)[],
    exact: Verdict | undefined,
    allowed: boolean,
    source: VerdictSource,
  ): Verdict {
    const decisions = new Array(requests.length);
    for (let i = 0, j = 0; i < requests.length; i++) {
      const take = takes[i];
      const r = requests[i];
      if (take !== undefined && take.kind !== 'exact') decisions[i] = toDecision(r, take.tokens, r.cost, allowed);
      else decisions[i] = exact === undefined ? toDecision(r, r.capacity, r.cost, allowed) : { ...exact.decisions[j++], allowed };
    }
    return { allowed, source, decisions };
  }

  /**
   * A refund of requests spent from leases here goes back into the lease when no call was sent for it
   * since (no call at all); the others are refunded exactly, in one call. Undefined when none was spent
   * from a lease (the usual refund).
   */
  backToLeases(requests: readonly BucketRequest[]): Promise<number[] | undefined> | undefined {
    const book = this.book;
    let tokens: number[] | undefined;
    let rest: BucketRequest[] | undefined;
    let at: number[] | undefined;
    for (let i = 0; i < requests.length; i++) {
      const request = requests[i];
      if (!book.spent(request)) continue;
      tokens ??= new Array<number>(requests.length);
      const back = book.putBack(request);
      if (back !== undefined) tokens[i] = back;
    }
    if (tokens === undefined) return undefined;
    for (let i = 0; i < requests.length; i++) {
      if (tokens[i] !== undefined) continue;
      (rest ??= []).push(requests[i]);
      (at ??= []).push(i);
    }
    if (rest === undefined) return Promise.resolve(tokens);
    return this.refund(rest).then((exact) => {
      if (exact === undefined) return undefined;
      at!.forEach((i, j) => (tokens![i] = exact[j]));
      return tokens;
    });
  }
}

/** The tokens behind the exact verdict's decision `j` (its remaining count: whole tokens, enough to size a batch). */
function exactTokens(verdict: Verdict, j: number): number {
  return verdict.decisions[j].remaining;
}
