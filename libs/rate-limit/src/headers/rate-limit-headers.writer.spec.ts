import type { BucketDecision } from '../rate-limit.interfaces.js';
import { mostRestrictive } from './rate-limit-headers.writer.js';

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
