import type { Verdict, VerdictSource } from '../rate-limit.interfaces.js';
import type { TakeResult } from '../stores/bucket-store.interface.js';
import { type BucketRequest, toDecision } from '../stores/token-bucket.js';

/** A store's answer (or the in-process buckets') as a verdict: one decision per request, in order. */
export function toVerdict(requests: readonly BucketRequest[], result: TakeResult, source: VerdictSource): Verdict {
  const { allowed, tokens } = result;
  return { allowed, source, decisions: requests.map((r, i) => toDecision(r, tokens[i], r.cost, allowed)) };
}
