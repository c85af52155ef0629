import { toDecision } from '../bucket/token-bucket.js';
import { assertBucketPolicy } from '../policies/policy.js';
import type { BucketDecision, BucketPolicy } from '../rate-limit.interfaces.js';
import { resolveOptions } from '../rate-limit.options-resolver.js';
import { mostRestrictive, RateLimitHeadersWriter } from './rate-limit-headers.writer.js';

const decision = (limit: number, remaining: number, retryAfterSeconds = 0): BucketDecision => ({
  allowed: retryAfterSeconds === 0,
  limit,
  remaining,
  retryAfterSeconds,
  resetSeconds: 0,
});

describe('the policy the headers describe', () => {
  it('is the one with the fewest remaining when allowed', () => {
    expect(mostRestrictive([decision(100, 50), decision(1000, 7), decision(10, 9)], true)).toBe(1);
  });

  it('breaks a tie on remaining by the smaller capacity', () => {
    expect(mostRestrictive([decision(1000, 5), decision(10, 5)], true)).toBe(1);
  });

  it('is the one with the longest wait when denied', () => {
    expect(mostRestrictive([decision(10, 0, 1), decision(1000, 0, 3600), decision(5, 4, 0)], false)).toBe(1);
  });
});

describe('header values under extreme policies', () => {
  /** Policies at and beyond the bounds: the ones validation accepts must give integer headers. */
  const candidates: BucketPolicy[] = [
    { capacity: 1, refillPerSecond: 1e-300 },
    { capacity: 1e25, refillPerSecond: 1 },
    { capacity: 1e17, refillPerSecond: 1e6 },
    { capacity: 1e9, refillPerSecond: 1 / 86_400 },
    { capacity: 1e12, refillPerSecond: 1 },
    { capacity: 1, refillPerSecond: 1e-12 },
    { capacity: 1e12, refillPerSecond: 1e300 },
    { capacity: 7, refillPerSecond: Number.MAX_VALUE },
    { capacity: 3, refillPerSecond: 5 / 60 },
  ];
  const accepted = candidates.filter((policy) => {
    try {
      assertBucketPolicy(policy, 'test');
      return true;
    } catch {
      return false;
    }
  });

  it('accepts the largest bounded policies and refuses the others', () => {
    expect(accepted).toEqual([
      { capacity: 1e12, refillPerSecond: 1 },
      { capacity: 1, refillPerSecond: 1e-12 },
      { capacity: 1e12, refillPerSecond: 1e300 },
      { capacity: 7, refillPerSecond: Number.MAX_VALUE },
      { capacity: 3, refillPerSecond: 5 / 60 },
    ]);
  });

  it.each(['draft-6', 'draft-7', 'draft-8'] as const)(
    'are finite, non-negative integers for every accepted policy (%s)',
    (standardHeaders) => {
      const writer = new RateLimitHeadersWriter(resolveOptions({ standardHeaders, store: 'memory' }));
      for (const policy of accepted) {
        const { capacity } = policy;
        for (const cost of [1, capacity]) {
          for (const tokens of [0, 1e-9, 0.5, capacity - 1, capacity - 0.5, capacity, -1, Number.NaN]) {
            for (const allowed of [true, false]) {
              const headers = new Map<string, string>();
              const response = { setHeader: (name: string, value: string) => headers.set(name, value) };
              const decision = toDecision(policy, tokens, cost, allowed);
              writer.write(response, [{ ...policy, scope: 'extreme' }], { allowed, source: 'store', decisions: [decision] });
              for (const [name, value] of headers) {
                const parts = value.replace(/"extreme"/g, '').split(/[,;]\s*/).filter((part) => part !== '');
                const numbers = parts.map((part) => part.slice(part.indexOf('=') + 1));
                for (const number of numbers) {
                  expect({ policy, cost, tokens, name, number }).toEqual({ policy, cost, tokens, name, number: expect.stringMatching(/^\d+$/) });
                  expect(Number.isSafeInteger(Number(number))).toBe(true);
                }
              }
            }
          }
        }
      }
    },
  );
});
