import {
  MAX_CAPACITY,
  MAX_WINDOW_SECONDS,
  mergeRepeatedKeys,
  repair,
  storedTtlMs,
  toDecision,
} from '../../../libs/rate-limit/src/stores/token-bucket.js';

describe('the numbers headers carry (toDecision)', () => {
  // Fractional tokens and a refill that divides nothing evenly: floor and ceil give different answers.
  const policy = { capacity: 10, refillPerSecond: 0.3 };

  it('remaining is the floor of the tokens, reset the ceiling of the seconds until full', () => {
    // 2.9 tokens: 2 remain; 7.1 tokens short at 0.3/s is 23.67 s, so 24.
    expect(toDecision(policy, 2.9, 1, true)).toEqual({ allowed: true, limit: 10, remaining: 2, retryAfterSeconds: 0, resetSeconds: 24 });
    // 9.99 tokens: 9 remain, and a bucket 0.01 short is not full: 1 s, not 0.
    expect(toDecision(policy, 9.99, 1, true)).toEqual({ allowed: true, limit: 10, remaining: 9, retryAfterSeconds: 0, resetSeconds: 1 });
    expect(toDecision(policy, 10, 1, true)).toEqual({ allowed: true, limit: 10, remaining: 10, retryAfterSeconds: 0, resetSeconds: 0 });
  });

  it('Retry-After is the ceiling of the seconds until the cost is there, and never 0 for a refusal', () => {
    // 0.45 tokens, cost 2: 1.55 short at 0.3/s is 5.17 s, so 6; full in 9.55 / 0.3 = 31.83 s, so 32.
    expect(toDecision(policy, 0.45, 2, false)).toEqual({ allowed: false, limit: 10, remaining: 0, retryAfterSeconds: 6, resetSeconds: 32 });
    // Half a token short at 1000/s is 0.5 ms away: still 1 s, the smallest wait a header can say.
    expect(toDecision({ capacity: 5, refillPerSecond: 1000 }, 0.5, 1, false)).toEqual({
      allowed: false,
      limit: 5,
      remaining: 0,
      retryAfterSeconds: 1,
      resetSeconds: 1,
    });
    // A bucket that had its cost while another policy refused the request waits for nothing.
    expect(toDecision(policy, 2.9, 1, false).retryAfterSeconds).toBe(0);
  });
});

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
    for (const policy of [
      { capacity: 1, refillPerSecond: 1e-12 },
      { capacity: 1e12, refillPerSecond: 1e300 },
      { capacity: 5, refillPerSecond: 1 },
    ]) {
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
