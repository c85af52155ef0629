import { DenyCache } from '../../../libs/rate-limit/src/engine/deny-cache.js';
import type { BucketRequest } from '../../../libs/rate-limit/src/stores/token-bucket.js';

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

  it('does not learn an answer to a request sent before forget(), however late it arrives', () => {
    let now = 1000;
    const cache = new DenyCache(100, () => now);
    now = 1010;
    cache.forget('a'); // reset at 1010
    cache.learn([request('a'), request('b')], denied(0, 0), 1005); // sent at 1005, before the reset
    expect(cache.deny([request('a')], 1020)).toBeUndefined();
    expect(cache.deny([request('b')], 1020)).toBeDefined(); // b was not reset: learned
    cache.learn([request('a')], denied(0), 1011); // sent after the reset: learned
    expect(cache.deny([request('a')], 1020)).toBeDefined();
  });

  it('remembers a reset for resetMemoryMs and at most maxEntries resets', () => {
    let now = 0;
    const cache = new DenyCache(3, () => now, 1000);
    const slow = (key: string) => request(key, 1, 10, 0.001); // stays short of 1 token for 1000 s
    cache.forget('a');
    now = 999;
    cache.forget('b');
    cache.learn([slow('a')], denied(0), -1);
    expect(cache.deny([slow('a')], 999)).toBeUndefined(); // a's reset still remembered
    now = 1001;
    cache.forget('c'); // a's reset is older than 1000 ms: dropped
    cache.learn([slow('a')], denied(0), -1);
    expect(cache.deny([slow('a')], 1001)).toBeDefined();
    cache.forget('d');
    cache.forget('e'); // three resets at most: b goes
    cache.learn([slow('b'), slow('c')], denied(0, 0), 500);
    expect(cache.deny([slow('b')], 1001)).toBeDefined();
    expect(cache.deny([slow('c')], 1001)).toBeUndefined();
  });

  it('ignores an entry learnt under a penalty for a request of the same numbers without one', () => {
    // A 30 s penalty at 1/s left the bucket at -29; a call without blockSeconds repairs that to 0 and
    // is allowed 1 s later: the entry must not answer it (found by the model test).
    const cache = new DenyCache();
    const penalised = { ...request('a', 1, 1, 1), blockSeconds: 30 };
    cache.learn([penalised], { allowed: false, tokens: [-29], penaltyMs: [30_000] }, 0);
    expect(cache.deny([penalised], 1000)).toBeDefined();
    expect(cache.deny([request('a', 1, 1, 1)], 1000)).toBeUndefined();
    expect(cache.deny([penalised], 1000)).toBeDefined(); // the entry stays for its own policy
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

  describe('penalties (blockSeconds)', () => {
    // capacity 3, 1 token/s, a 2 s penalty: a refusal leaves 1 - 2 = -1 tokens and 2000 ms of penalty.
    const penalised = (key: string, blockSeconds = 2): BucketRequest => ({ ...request(key, 1, 3, 1), blockSeconds });
    const refusal = (tokens: number, penaltyMs: number) => ({ allowed: false, tokens: [tokens], penaltyMs: [penaltyMs] });

    it('denies a penalised bucket for as long as its penalty is known to run (the whole penalty)', () => {
      const cache = new DenyCache();
      cache.learn([penalised('a')], refusal(-1, 2000), 0);
      // Penalty: at least until 0 - 1 ms + 2000 ms; tokens: -1 + (t + 1) / 1000 < 1 until 1999 ms.
      expect(cache.deny([penalised('a')], 1998)).toEqual([expect.closeTo(0.999, 9)]);
      expect(cache.deny([penalised('a')], 1999.5)).toBeUndefined();
    });

    it('asks the store when the penalty is over, even while the tokens bound is short: the store starts a new penalty', () => {
      const cache = new DenyCache();
      cache.learn([penalised('a')], refusal(-1, 2000), 0);
      // The penalty ended at 2000; a take at 2050 was allowed and left 0.05 tokens.
      cache.learn([penalised('a')], { allowed: true, tokens: [0.05], penaltyMs: [0] }, 2050);
      expect(cache.deny([penalised('a')], 2060)).toBeUndefined();
      // Not a request without a penalty: its call repairs the negative tokens to 0 (the model test found it).
      expect(cache.deny([request('a', 1, 3, 1)], 2060)).toBeUndefined();
    });

    it('asks the store about a bucket with a penalty it learnt no penalty for (a refusal without one)', () => {
      const cache = new DenyCache();
      cache.learn([request('a', 1, 3, 1)], denied(0), 0);
      expect(cache.deny([penalised('a')], 10)).toBeUndefined();
      expect(cache.deny([request('a', 1, 3, 1)], 10)).toBeDefined();
    });

    it('denies several buckets only when every bucket with a penalty is known to be penalised', () => {
      const cache = new DenyCache();
      const roomy = penalised('roomy');
      const short = penalised('short');
      // Only `short` was penalised; `roomy` had its tokens.
      cache.learn([roomy, short], { allowed: false, tokens: [2, -1], penaltyMs: [0, 2000] }, 0);
      expect(cache.deny([roomy, short], 10)).toBeUndefined();
      // Nor when `roomy` comes without its penalty: an entry answers only the penalty it was learned under
      // (a call without one repairs negative stored tokens, which this instance cannot see).
      expect(cache.deny([request('roomy', 1, 3, 1), short], 10)).toBeUndefined();
      cache.learn([short], { allowed: false, tokens: [-1], penaltyMs: [2000] }, 0);
      expect(cache.deny([short], 10)).toBeDefined();
    });

    it('keeps the later of two penalty ends (a penalty is never shortened)', () => {
      const cache = new DenyCache();
      cache.learn([penalised('a')], refusal(-1, 2000), 0);
      cache.learn([penalised('a')], refusal(-0.5, 1500), 500);
      cache.learn([penalised('a')], refusal(-0.9, 100), 100);
      expect(cache.deny([penalised('a')], 1990)).toBeDefined();
    });
  });
});
