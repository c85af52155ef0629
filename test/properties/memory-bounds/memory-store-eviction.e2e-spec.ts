import type { BucketRequest } from '../../../libs/rate-limit/src/stores/token-bucket.js';
import { MemoryBucketStore } from '../../../libs/rate-limit/src/stores/memory/memory-bucket.store.js';

/** capacity 2, 1 token per second: drained by one request of cost 2, full again 2 s later. */
const drain = (key: string): BucketRequest => ({ key, capacity: 2, refillPerSecond: 1, cost: 2 });

describe('MemoryBucketStore bounds', () => {
  let now: number;
  let evicted: string[];
  const store = (maxBuckets: number) => {
    evicted = [];
    return new MemoryBucketStore({ maxBuckets, clock: () => now, onEvict: (key) => evicted.push(key) });
  };
  beforeEach(() => {
    now = 1_000_000;
  });

  it('holds at most maxBuckets, forgetting the least recently written first', () => {
    const buckets = store(100);
    for (let i = 0; i < 250; i++) expect(buckets.takeSync([drain(`k${i}`)]).allowed).toBe(true);
    expect(buckets.size).toBe(100);
    // k0..k149 were forgotten before they refilled, each reported once, oldest first.
    expect(evicted).toEqual(Array.from({ length: 150 }, (_, i) => `k${i}`));
    // Refusals write nothing, so these two do not change the order.
    expect(buckets.takeSync([drain('k150')]).allowed).toBe(false); // still held: drained
    expect(buckets.takeSync([drain('k249')]).allowed).toBe(false);
    expect(buckets.takeSync([drain('k149')]).allowed).toBe(true); // forgotten: full again (and k150 goes now)
    expect(evicted.at(-1)).toBe('k150');
  });

  it('evicts in write order across thousands of evictions, rewrites and clear(), as a plain list would', () => {
    const buckets = store(50);
    // A model: keys in write order, the oldest first.
    let line: string[] = [];
    const expected: string[] = [];
    let seed = 20261201;
    // An LCG's high bits (its low ones repeat quickly).
    const random = (n: number) => ((seed = (seed * 1103515245 + 12345) % 2 ** 31), Math.floor((seed / 2 ** 31) * n));
    // Never refused, never full again within the test: every call writes.
    const take = (key: string) => ({ key, capacity: 1e6, refillPerSecond: 1e-3, cost: 1 });
    for (let step = 0; step < 20_000; step++) {
      if (random(5000) === 0) {
        buckets.clear();
        line = [];
        continue;
      }
      const key = `k${random(120)}`;
      const at = line.indexOf(key);
      if (at >= 0) line.splice(at, 1);
      else if (line.length >= 50) expected.push(line.shift() as string);
      line.push(key);
      buckets.takeSync([take(key)]);
    }
    expect(evicted.length).toBeGreaterThan(5_000);
    expect(evicted).toEqual(expected);
    expect(buckets.size).toBe(line.length);
  });

  it('counts a write as use: a bucket written again moves to the back of the line', () => {
    const buckets = store(3);
    for (const key of ['a', 'b', 'c']) buckets.takeSync([{ ...drain(key), cost: 1 }]);
    buckets.takeSync([{ ...drain('a'), cost: 1 }]); // a: 0 tokens now, written last
    buckets.takeSync([drain('d')]); // evicts b, the least recently written
    expect(evicted).toEqual(['b']);
    expect(buckets.takeSync([drain('a')]).tokens).toEqual([0]); // a is still held, at 0 tokens
  });

  it('sweeps buckets that are full again before forgetting any that is not', () => {
    const buckets = store(100);
    for (let i = 0; i < 100; i++) buckets.takeSync([drain(`old${i}`)]);
    now += 2_002; // 2 s refill the old ones (plus the 1 ms the store keeps as margin)
    for (let i = 0; i < 100; i++) buckets.takeSync([drain(`new${i}`)]);
    expect(evicted).toEqual([]);
    expect(buckets.size).toBe(100);
    for (let i = 0; i < 100; i++) expect(buckets.takeSync([drain(`new${i}`)]).allowed).toBe(false);
  });

  it('sweeps the full buckets rather than the least recently written ones when those are not full', () => {
    const buckets = store(10);
    // Written first (the least recently used): 5 buckets that refill in 2,000 s, drained.
    const slow = (key: string): BucketRequest => ({ key, capacity: 2, refillPerSecond: 0.001, cost: 2 });
    for (let i = 0; i < 5; i++) expect(buckets.takeSync([slow(`slow${i}`)]).allowed).toBe(true);
    // Written after them: 5 buckets that are full again 2 s later.
    for (let i = 0; i < 5; i++) expect(buckets.takeSync([drain(`fast${i}`)]).allowed).toBe(true);
    now += 2_002;
    // 5 new buckets in a store of 10: plain LRU would forget the 5 slow ones (drained: they would start full
    // again), the sweep forgets the 5 full ones, which changes no decision.
    for (let i = 0; i < 5; i++) buckets.takeSync([drain(`new${i}`)]);
    expect(evicted).toEqual([]);
    expect(buckets.size).toBe(10);
    for (let i = 0; i < 5; i++) expect(buckets.takeSync([slow(`slow${i}`)])).toMatchObject({ allowed: false });
    // The fast ones were forgotten full: they answer as full buckets would.
    expect(buckets.takeSync([drain('fast0')])).toMatchObject({ allowed: true, tokens: [0] });
  });

  it('does not count a bucket as full a moment before it is', () => {
    const buckets = store(1);
    buckets.takeSync([drain('a')]);
    now += 1_999; // 1.999 tokens: one short of 2 by a thousandth
    buckets.takeSync([drain('b')]);
    expect(evicted).toEqual(['a']); // forgotten while not full: reported
  });

  it('reports nothing for a bucket that expired or was full when it made room', () => {
    const buckets = store(1);
    buckets.takeSync([{ ...drain('a'), cost: 1 }]);
    now += 1_002;
    buckets.takeSync([drain('b')]);
    expect(evicted).toEqual([]);
  });

  it('clear() forgets every bucket', () => {
    const buckets = store(10);
    for (let i = 0; i < 5; i++) buckets.takeSync([drain(`k${i}`)]);
    buckets.clear();
    expect(buckets.size).toBe(0);
    expect(buckets.takeSync([drain('k0')]).allowed).toBe(true);
  });

  it.each([0, -1, 1.5, Number.NaN, '10'])('refuses maxBuckets %p', (maxBuckets) => {
    expect(() => new MemoryBucketStore({ maxBuckets: maxBuckets as number })).toThrow(/maxBuckets must be an integer >= 1/);
  });
});
