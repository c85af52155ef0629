import type { BucketRequest } from '../token-bucket.js';
import { hashTag } from './cluster-slots.js';
import { hasPenalty, type ScriptResult, type TokenBucketMode } from './lua/script-codec.js';

/** One decision's part on one hash tag: its requests, mode and (the first part only) the deadline's start. */
type RunPart = (requests: readonly BucketRequest[], mode: TokenBucketMode, sent: (() => void) | undefined) => Promise<ScriptResult>;

/** The positions of `requests` by hash tag, in the order the tags first appear: one group per Cluster slot. */
export function tagGroups(requests: readonly BucketRequest[]): number[][] {
  const groups = new Map<string, number[]>();
  requests.forEach((request, i) => {
    const tag = hashTag(request.key);
    const group = groups.get(tag);
    if (group) group.push(i);
    else groups.set(tag, [i]);
  });
  return [...groups.values()];
}

/**
 * One decision over buckets of several hash tags on a Cluster, where no script can hold them all: group
 * by group, in order; when one refuses, what the earlier groups took is refunded and the later ones are
 * peeked, so that the answer is all or nothing (docs/guides/redis-cluster.md).
 */
export async function takeByGroup(
  requests: readonly BucketRequest[],
  groups: number[][],
  mode: TokenBucketMode,
  sent: (() => void) | undefined,
  run: RunPart,
): Promise<ScriptResult> {
  const tokens = new Array<number>(requests.length);
  const penaltyMs = hasPenalty(requests) ? new Array<number>(requests.length).fill(0) : undefined;
  const pick = (group: number[]) => group.map((i) => requests[i]);
  const record = (group: number[], result: ScriptResult) =>
    group.forEach((i, j) => {
      tokens[i] = result.tokens[j];
      if (penaltyMs !== undefined) penaltyMs[i] = result.penaltyMs?.[j] ?? 0;
    });
  const answer = (allowed: boolean): ScriptResult => (penaltyMs === undefined ? { allowed, tokens } : { allowed, tokens, penaltyMs });
  for (let g = 0; g < groups.length; g++) {
    // The deadline runs from the first group's call: the later ones are part of the same decision.
    const result = await run(pick(groups[g]), mode, g === 0 ? sent : undefined);
    record(groups[g], result);
    if (!result.allowed) {
      const earlier = groups.slice(0, g);
      const later = groups.slice(g + 1);
      const [refunded, peeked] = await Promise.all([
        Promise.all(earlier.map((group) => run(pick(group), mode === 'take' ? 'refund' : 'peek', undefined))),
        Promise.all(later.map((group) => run(pick(group), 'peek', undefined))),
      ]);
      earlier.forEach((group, k) => record(group, refunded[k]));
      later.forEach((group, k) => record(group, peeked[k]));
      return answer(false);
    }
  }
  return answer(true);
}
