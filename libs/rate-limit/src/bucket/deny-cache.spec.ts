import { DenyCache } from './deny-cache.js';
import type { BucketRequest } from './token-bucket.js';

const request = (key: string, cost = 1, capacity = 10, refillPerSecond = 2): BucketRequest => ({
  key,
  capacity,
  refillPerSecond,
  cost,
});
const denied = (...tokens: number[]) => ({ allowed: false, tokens });
const allowed = (...tokens: number[]) => ({ allowed: true, tokens });

describe('DenyCache', () => {
  it('denies a bucket Redis left at 0.25 tokens (2/s) for 374 ms after sending, then asks again', () => {
    const cache = new DenyCache();
    cache.learn([request('a')], denied(0.25), 1000);
    // 0.25 + (t - 1000 + 1 ms slack) * 2/1000 < 1  <=>  t < 1374
    expect(cache.deny([request('a')], 1000)).toEqual([expect.closeTo(0.252, 9)]);
    expect(cache.deny([request('a')], 1373.9)).toBeDefined();
    expect(cache.deny([request('a')], 1374.1)).toBeUndefined();
  });

  it('is exact for any cost: a cost of 4 stays denied until 4 tokens can exist', () => {
    const cache = new DenyCache();
    cache.learn([request('a', 4)], denied(1), 0);
    // 1 + (t + 1) * 2/1000 < 4  <=>  t < 1499
    expect(cache.deny([request('a', 4)], 1498)).toBeDefined();
    expect(cache.deny([request('a', 4)], 1500)).toBeUndefined();
    // a cost-1 request on the same bucket could succeed: ask Redis
    const fresh = new DenyCache();
    fresh.learn([request('a', 4)], denied(1), 0);
    expect(fresh.deny([request('a', 1)], 0)).toBeUndefined();
  });

  it('remembers nothing from allowed decisions it had no entry for (the allowed path writes nothing)', () => {
    const cache = new DenyCache();
    cache.learn([request('a')], allowed(0.5), 0);
    expect(cache.size).toBe(0);
  });

  it('keeps the lower of two bounds for one bucket', () => {
    const cache = new DenyCache();
    cache.learn([request('a')], denied(0.9), 0);
    cache.learn([request('a')], allowed(0), 10); // a later allowance drained it: 0 tokens at 10 ms
    // from 0 at 10 ms (minus 1 ms slack): 1 token at 509 ms
    expect(cache.deny([request('a')], 500)).toBeDefined();
    cache.learn([request('a')], denied(0.95), 20); // looser than what is known: ignored
    expect(cache.deny([request('a')], 500)).toBeDefined();
  });

  it('drops an entry once the bucket may be full, and on forget() (a local reset)', () => {
    const cache = new DenyCache();
    cache.learn([request('a', 10)], denied(0), 0);
    expect(cache.deny([request('a', 10)], 4990)).toBeDefined();
    expect(cache.deny([request('a', 10)], 4999)).toBeUndefined();
    expect(cache.size).toBe(0);
    cache.learn([request('b')], denied(0), 0);
    cache.forget('b');
    expect(cache.deny([request('b')], 1)).toBeUndefined();
  });

  it('ignores an entry learnt under another policy of the same bucket', () => {
    const cache = new DenyCache();
    cache.learn([request('a', 1, 10, 2)], denied(0), 0);
    expect(cache.deny([request('a', 1, 10, 50)], 1)).toBeUndefined();
  });

  it('denies a request of several buckets only when every bucket is known and one is short', () => {
    const cache = new DenyCache();
    const both = [request('a'), request('b', 1, 100, 100)];
    cache.learn(both, denied(0, 40), 0);
    expect(cache.deny(both, 10)).toEqual([expect.closeTo(0.022, 9), expect.closeTo(41.1, 9)]);
    expect(cache.deny([request('b', 1, 100, 100), request('c')], 10)).toBeUndefined();
  });

  it('holds at most maxEntries buckets, dropping the oldest first', () => {
    const cache = new DenyCache(100);
    for (let i = 0; i < 1000; i++) cache.learn([request(`k${i}`)], denied(0), 0);
    expect(cache.size).toBe(100);
    expect(cache.deny([request('k999')], 1)).toBeDefined();
    expect(cache.deny([request('k0')], 1)).toBeUndefined();
  });
});
