import { MAX_CAPACITY, MAX_WINDOW_SECONDS, mergeRepeatedKeys, repair, storedTtlMs, toDecision } from './token-bucket.js';

describe('token-bucket arithmetic with penalties', () => {
  it('toDecision: below 0 tokens nothing remains, and the waits count from the real tokens', () => {
    // A 30 s penalty at 1 token/s: 1 - 30 = -29 tokens.
    expect(toDecision({ capacity: 2, refillPerSecond: 1 }, -29, 1, false)).toEqual({
      allowed: false,
      limit: 2,
      remaining: 0,
      retryAfterSeconds: 30,
      resetSeconds: 31,
    });
    expect(toDecision({ capacity: 2, refillPerSecond: 1 }, -28.5, 1, false).retryAfterSeconds).toBe(30);
  });

  it.each([-Infinity, Number.NaN, -1e300, -Number.MAX_VALUE])('toDecision keeps headers finite integers for tokens %s', (tokens) => {
    for (const policy of [{ capacity: 1, refillPerSecond: 1e-12 }, { capacity: 1e12, refillPerSecond: 1e300 }, { capacity: 5, refillPerSecond: 1 }]) {
      const decision = toDecision(policy, tokens, 1, false);
      for (const value of [decision.remaining, decision.retryAfterSeconds, decision.resetSeconds]) {
        expect(Number.isSafeInteger(value) && value >= 0).toBe(true);
        expect(value).toBeLessThanOrEqual(2 * MAX_WINDOW_SECONDS + 1);
      }
    }
  });

  it('repair keeps tokens down to -(blockSeconds * R) and repairs lower ones to 0', () => {
    const state = { tokens: -29, ts: 0 };
    expect(repair(state, 0, 30, 1)).toBe(state);
    expect(repair({ tokens: -30, ts: 0 }, 0, 30, 1)).toEqual({ tokens: -30, ts: 0 });
    expect(repair({ tokens: -30.5, ts: 0 }, 0, 30, 1)).toEqual({ tokens: 0, ts: 0 });
    expect(repair(state, 0)).toEqual({ tokens: 0, ts: 0 });
    expect(repair({ tokens: -Infinity, ts: 0 }, 0, 30, 1)).toBeUndefined();
  });

  it('storedTtlMs: the idle TTL, or the time to fill from below 0', () => {
    expect(storedTtlMs({ capacity: 2, refillPerSecond: 1 }, 0)).toBe(4000);
    expect(storedTtlMs({ capacity: 2, refillPerSecond: 1 }, -29)).toBe(31_000);
    // The bounds: at most 2e15 ms.
    expect(storedTtlMs({ capacity: MAX_CAPACITY, refillPerSecond: 1 }, -MAX_CAPACITY)).toBe(2e15);
  });

  it('mergeRepeatedKeys carries the longer blockSeconds', () => {
    const merged = mergeRepeatedKeys([
      { key: 'a', capacity: 5, refillPerSecond: 1, cost: 1, blockSeconds: 10 },
      { key: 'b', capacity: 5, refillPerSecond: 1, cost: 1 },
      { key: 'a', capacity: 5, refillPerSecond: 1, cost: 2, blockSeconds: 30 },
      { key: 'b', capacity: 5, refillPerSecond: 1, cost: 1, blockSeconds: 5 },
      { key: 'c', capacity: 5, refillPerSecond: 1, cost: 1, blockSeconds: 20 },
      { key: 'c', capacity: 5, refillPerSecond: 1, cost: 1 },
    ]);
    expect(merged?.requests).toEqual([
      { key: 'a', capacity: 5, refillPerSecond: 1, cost: 3, blockSeconds: 30 },
      { key: 'b', capacity: 5, refillPerSecond: 1, cost: 2, blockSeconds: 5 },
      { key: 'c', capacity: 5, refillPerSecond: 1, cost: 2, blockSeconds: 20 },
    ]);
  });
});
