import { toDecision } from '../../../libs/rate-limit/src/stores/token-bucket.js';
import { assertBucketPolicy } from '../../../libs/rate-limit/src/bucket/bucket-policy.check.js';
import type { BucketDecision, BucketPolicy } from '../../../libs/rate-limit/src/rate-limit.interfaces.js';
import { resolveOptions } from '../../../libs/rate-limit/src/rate-limit.options-resolver.js';
import {
  type HeaderPolicy,
  mostRestrictive,
  RateLimitHeadersWriter,
} from '../../../libs/rate-limit/src/headers/rate-limit-headers.writer.js';

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

describe('header values, exactly', () => {
  /** Capacity 10 at 0.3 tokens/s: a window of 33.3 s, so w=34; fractional tokens everywhere below. */
  const reports: HeaderPolicy = { capacity: 10, refillPerSecond: 0.3, scope: 'reports' };
  const burst: HeaderPolicy = { capacity: 100, refillPerSecond: 0.01, scope: 'Controller.burst' };

  function headersOf(
    options: { standardHeaders: 'draft-6' | 'draft-7' | 'draft-8' | false; legacyHeaders?: boolean },
    policies: HeaderPolicy[],
    tokens: number[],
    cost: number,
    allowed: boolean,
  ): Record<string, string> {
    const writer = new RateLimitHeadersWriter(resolveOptions({ ...options, store: 'memory' }));
    const headers: Record<string, string> = {};
    const response = { setHeader: (name: string, value: string) => (headers[name] = value) };
    const decisions = policies.map((policy, i) => toDecision(policy, tokens[i], cost, allowed));
    writer.write(response, policies, { allowed, source: 'store', decisions });
    return headers;
  }

  it('draft-6 and legacy: Remaining is floor(tokens), Reset ceil(seconds to full), the window ceil(B / R)', () => {
    // 2.9 tokens: 2 remain; 7.1 short at 0.3/s is 23.67 s.
    expect(headersOf({ standardHeaders: 'draft-6' }, [reports], [2.9], 1, true)).toEqual({
      'X-RateLimit-Limit': '10',
      'X-RateLimit-Remaining': '2',
      'X-RateLimit-Reset': '24',
      'RateLimit-Limit': '10',
      'RateLimit-Remaining': '2',
      'RateLimit-Reset': '24',
      'RateLimit-Policy': '10;w=34',
    });
  });

  it('a refusal: Retry-After is ceil(seconds until the cost), Remaining 0', () => {
    // 0.45 tokens, cost 2: 1.55 short is 5.17 s; full in 9.55 / 0.3 = 31.83 s.
    expect(headersOf({ standardHeaders: 'draft-6' }, [reports], [0.45], 2, false)).toEqual({
      'X-RateLimit-Limit': '10',
      'X-RateLimit-Remaining': '0',
      'X-RateLimit-Reset': '32',
      'RateLimit-Limit': '10',
      'RateLimit-Remaining': '0',
      'RateLimit-Reset': '32',
      'RateLimit-Policy': '10;w=34',
      'Retry-After': '6',
    });
  });

  it('Retry-After is never 0: a wait under a second is 1', () => {
    const fast: HeaderPolicy = { capacity: 5, refillPerSecond: 1000, scope: 'fast' };
    expect(headersOf({ standardHeaders: false, legacyHeaders: false }, [fast], [0.5], 1, false)).toEqual({ 'Retry-After': '1' });
  });

  it('draft-7: one combined field, and the policy', () => {
    expect(headersOf({ standardHeaders: 'draft-7', legacyHeaders: false }, [reports], [2.9], 1, true)).toEqual({
      RateLimit: 'limit=10, remaining=2, reset=24',
      'RateLimit-Policy': '10;w=34',
    });
  });

  it('draft-8: every policy by name, the combined field per policy', () => {
    // The burst bucket: 99.5 tokens, 99 remain, 0.5 short at 0.01/s is 50 s; the reports bucket as above.
    expect(headersOf({ standardHeaders: 'draft-8', legacyHeaders: false }, [burst, reports], [99.5, 2.9], 1, true)).toEqual({
      'RateLimit-Policy': '"Controller.burst";q=100;w=10000, "reports";q=10;w=34',
      RateLimit: '"Controller.burst";r=99;t=50, "reports";r=2;t=24',
    });
  });

  it('with several policies the legacy and draft-6 fields describe the fewest remaining, or the longest wait', () => {
    expect(headersOf({ standardHeaders: 'draft-6' }, [burst, reports], [99.5, 2.9], 1, true)).toMatchObject({
      'X-RateLimit-Remaining': '2',
      'RateLimit-Policy': '10;w=34',
    });
    // Refused, cost 2: the burst bucket lacks 1.75 tokens at 0.01/s (175 s), the reports bucket 1.55 at 0.3/s (6 s).
    expect(headersOf({ standardHeaders: 'draft-6' }, [burst, reports], [0.25, 0.45], 2, false)).toMatchObject({
      'X-RateLimit-Limit': '100',
      'RateLimit-Reset': '9975',
      'Retry-After': '175',
    });
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
                const parts = value
                  .replace(/"extreme"/g, '')
                  .split(/[,;]\s*/)
                  .filter((part) => part !== '');
                const numbers = parts.map((part) => part.slice(part.indexOf('=') + 1));
                for (const number of numbers) {
                  expect({ policy, cost, tokens, name, number }).toEqual({
                    policy,
                    cost,
                    tokens,
                    name,
                    number: expect.stringMatching(/^\d+$/),
                  });
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
