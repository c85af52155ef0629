import type { BucketPolicy, PriorityLevel, ReserveOption } from '../rate-limit.interfaces.js';
import { type Digest, serviceKey } from '../keys/identity-keys.js';
import { RateLimitConfigError } from '../errors/rate-limit.errors.js';
import type { BucketRequest } from '../stores/token-bucket.js';
import { keysOf, unknownKeyOf } from '../unknown-keys.js';
import { assertCost, assertServicePolicy, describeValue } from './bucket-policy.check.js';
import { compilePriority, floorOf } from './priority-option.js';

/**
 * A `consume()` / `consumeAll()` policy with a priority (docs/guides/priorities.md): how deep into the
 * bucket the call may go. `reserve` as on a route policy; default once `priority` is given: 0.2 kept from
 * `sheddable` calls. `peek()` and `acquire()` take none.
 */
export interface PrioritizedPolicy extends BucketPolicy {
  priority?: PriorityLevel;
  reserve?: ReserveOption;
}

/** The keys a policy with a priority adds (consume, consumeAll, refund). */
const PRIORITY_KEYS: readonly string[] = ['priority', 'reserve'];

/** One bucket in a `consumeAll()` call. */
export interface BucketEntry {
  name: string;
  /** The bucket's numbers, and optionally the call's `priority` and `reserve` (`PrioritizedPolicy`). */
  policy: PrioritizedPolicy;
  /** Tokens to take; default 1. */
  cost?: number;
}

const ENTRY_KEYS = keysOf<keyof BucketEntry>({ name: true, policy: true, cost: true });

/** The request of one bucket, its name and numbers checked; `method` (and `index` in consumeAll()'s entries) name the call in errors. */
export function serviceRequest(
  entry: BucketEntry,
  cost: number,
  method: BucketMethod,
  keyPrefix: string,
  hash: Digest,
  index?: number,
): BucketRequest {
  if (index !== undefined && (typeof entry !== 'object' || entry === null)) {
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_INVALID_CONSUME_ALL',
      `BucketService.consumeAll(): entries[${index}] must be { name, policy, cost? } (got ${describeValue(entry)})`,
    );
  }
  assertBucketName(entry.name, method, index);
  const where = `BucketService bucket "${entry.name}"`;
  const unknown = unknownKeyOf(entry, ENTRY_KEYS, 'the entry');
  if (unknown !== undefined) throw new RateLimitConfigError('ERR_RATE_LIMIT_UNKNOWN_OPTION', `BucketService ${unknown} on ${where}`);
  const policy = entry.policy;
  // A priority: consume() and consumeAll() take it (refund() accepts the same policy and ignores it).
  const prioritized = typeof policy === 'object' && policy !== null && (policy.priority !== undefined || policy.reserve !== undefined);
  if (prioritized && (method === 'peek' || method === 'acquire')) {
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_INVALID_POLICY',
      `BucketService.${method}() takes no priority or reserve (${method === 'peek' ? 'a peek answers for the bucket, whatever the level' : 'a reservation waits in line with every other, whatever the level'}) on ${where}`,
    );
  }
  assertServicePolicy(policy, where, prioritized ? PRIORITY_KEYS : undefined);
  assertCost(cost, policy.capacity, where, 'BucketService');
  const request: BucketRequest = {
    key: serviceKey(keyPrefix, entry.name, hash),
    capacity: policy.capacity,
    refillPerSecond: policy.refillPerSecond,
    cost,
  };
  if (prioritized) {
    const priority = compilePriority(policy.priority, policy.reserve, where, 'BucketService', false)!;
    const floor = floorOf(priority, priority.level!, policy.capacity);
    if (floor > 0) request.floor = floor;
  }
  return request;
}

/** The methods of `BucketService` that take a bucket name. */
export type BucketMethod = 'consume' | 'consumeAll' | 'peek' | 'refund' | 'reset' | 'acquire' | 'takeSlot' | 'withSlot';

/** The slots' key of a name's bucket key (`{prefix}{name}`): `{prefix}{name}!`, a key no bucket has. */
export function slotKey(bucketKey: string): string {
  return `${bucketKey}!`;
}

/**
 * A bucket name is a non-empty string. Anything else used to be taken as it was: `undefined` and `5` became the
 * buckets `{undefined}` and `{5}` (one bucket shared by every caller that lost its name), `''` the bucket `{}`,
 * and an object threw a raw TypeError from the key's digest.
 */
export function assertBucketName(name: unknown, method: BucketMethod, index?: number): asserts name is string {
  if (typeof name === 'string' && name !== '') return;
  const what = index === undefined ? 'the bucket name' : `entries[${index}].name`;
  throw new RateLimitConfigError(
    'ERR_RATE_LIMIT_INVALID_POLICY',
    `BucketService.${method}(): ${what} must be a non-empty string (got ${describeValue(name)})`,
  );
}

/**
 * A `consumeAll()` that names one bucket twice is merged (`decide`): that needs one policy, and a
 * summed cost the bucket can hold at all, else the call could never be allowed. A caller's mistake,
 * refused like a cost above the capacity in `consume()`.
 */
export function assertRepeatsFit(entries: readonly BucketEntry[], requests: readonly BucketRequest[]): void {
  if (requests.length < 2) return;
  const first = new Map<string, number>();
  const costs = new Map<string, number>();
  requests.forEach((request, i) => {
    const j = first.get(request.key);
    if (j === undefined) {
      first.set(request.key, i);
      costs.set(request.key, request.cost);
      return;
    }
    const name = entries[i].name;
    if (requests[j].capacity !== request.capacity || requests[j].refillPerSecond !== request.refillPerSecond) {
      throw new RateLimitConfigError(
        'ERR_RATE_LIMIT_INVALID_CONSUME_ALL',
        `BucketService bucket "${name}" appears twice with different policies in one consumeAll() call: give it one policy`,
      );
    }
    const cost = (costs.get(request.key) as number) + request.cost;
    costs.set(request.key, cost);
    if (cost > request.capacity) {
      throw new RateLimitConfigError(
        'ERR_RATE_LIMIT_INVALID_CONSUME_ALL',
        `BucketService costs of bucket "${name}" add up to ${cost}, more than its capacity ${request.capacity}, in one consumeAll() call`,
      );
    }
  });
}
