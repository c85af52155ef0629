import type { BucketStore } from '../stores/bucket-store.interface.js';
import type { CombinedSlotStore, SlotTakeResult } from '../stores/slots.js';
import type { BucketRequest } from '../stores/token-bucket.js';
import { T0 } from './scenarios.js';

/**
 * `verifyBucketStore(store, { slots: true })` for a store with `takeWithSlot` (a take and a slot decided
 * together): one case per rule, on the simulated clock (`options.now`), each on keys of its own.
 *
 * 1. Every bucket has its cost and a slot is free: the buckets are drained, the slot is held.
 * 2. The slot is refused: `allowed` false, the tokens the buckets hold, and no bucket touched.
 * 3. A bucket lacks its cost (or would go below its floor): no slot is asked for (`slot` undefined, the
 *    slot still free), and a penalty starts as a take's would.
 */
export async function checkTakeWithSlot(store: BucketStore & CombinedSlotStore, prefix: string): Promise<void> {
  const keys: string[] = [];
  const bucket = (name: string, extra: Partial<BucketRequest> = {}): BucketRequest => {
    keys.push(`${prefix}{with-slot}:${name}`);
    return { key: `${prefix}{with-slot}:${name}`, capacity: 5, refillPerSecond: 1, cost: 2, ...extra };
  };
  const slotKey = `${prefix}{with-slot}!slots`;
  keys.push(slotKey);
  const slot = (holder: string) => ({ key: slotKey, limit: 1, holder, leaseMs: 60_000 });
  const peek = async (requests: BucketRequest[], now: number) => (await store.take(requests, { dryRun: true, now })).tokens;
  const expect = (rule: string, actual: unknown, expected: unknown) => {
    if (JSON.stringify(actual) !== JSON.stringify(expected)) {
      throw new Error(
        `BucketStore conformance: takeWithSlot, ${rule}: expected ${JSON.stringify(expected)}, got ${JSON.stringify(actual)}`,
      );
    }
  };
  const shape = (result: SlotTakeResult) => ({
    allowed: result.allowed,
    tokens: result.tokens,
    held: result.slot === undefined ? 'not asked' : result.slot.held,
  });
  try {
    const pair = [bucket('a'), bucket('b', { capacity: 9, cost: 3 })];
    const first = await store.takeWithSlot(pair, slot('first'), { now: T0 });
    expect('rule 1 (both had their cost, the slot was free)', shape(first), { allowed: true, tokens: [3, 6], held: true });
    expect('rule 1: the buckets are drained', await peek(pair, T0), [3, 6]);

    const second = await store.takeWithSlot(pair, slot('second'), { now: T0 + 1_000 });
    expect('rule 2 (the slot is held by another)', shape(second), { allowed: false, tokens: [4, 7], held: false });
    expect('rule 2: no bucket is touched', await peek(pair, T0 + 1_000), [4, 7]);
    const freed = await store.giveBackSlot(slotKey, 'first');
    expect("rule 2: the first holder's slot is still the one held", freed.released, true);

    const short = [bucket('c'), bucket('d', { cost: 6, blockSeconds: 4 })];
    const refused = await store.takeWithSlot(short, slot('third'), { now: T0 + 1_000 });
    // The penalty leaves the short bucket penalty cost - blockSeconds * refill = 6 - 4 tokens.
    expect('rule 3 (a bucket lacks its cost)', shape(refused), { allowed: false, tokens: [5, 2], held: 'not asked' });
    if (refused.penaltyMs !== undefined) expect('rule 3: the penalty starts', refused.penaltyMs, [0, 4_000]);
    const floored = await store.takeWithSlot([bucket('e', { floor: 4 })], slot('fourth'), { now: T0 + 1_000 });
    expect('rule 3 (the take would go below its floor)', shape(floored), { allowed: false, tokens: [5], held: 'not asked' });
    const free = await store.takeSlot(slot('fifth'), { now: T0 + 1_000 });
    expect('rule 3: no slot was taken', free.held, true);
  } finally {
    await store.delete(keys).catch(() => undefined);
  }
}
