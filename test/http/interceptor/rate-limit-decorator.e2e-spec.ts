import { Injectable } from '@nestjs/common';
import { INTERCEPTORS_METADATA } from '@nestjs/common/constants.js';
import { RateLimit, RateLimitInterceptor, type RateLimitPolicy, type RateLimitResolver } from 'nest-redis-rate-limit';

@Injectable()
class Plans implements RateLimitResolver {
  resolve() {
    return { capacity: 5, refillPerSecond: 1 };
  }
}

/** Whether `@RateLimit(policy)` on a handler puts RateLimitInterceptor on it. */
function applied(policy: RateLimitPolicy): boolean {
  class Target {
    handler() {}
  }
  const descriptor = Object.getOwnPropertyDescriptor(Target.prototype, 'handler')!;
  RateLimit(policy)(Target.prototype, 'handler', descriptor);
  const interceptors: unknown[] = Reflect.getMetadata(INTERCEPTORS_METADATA, descriptor.value) ?? [];
  return interceptors.includes(RateLimitInterceptor);
}

/** The rule the README states under "When each policy is decided". */
describe('@RateLimit applies RateLimitInterceptor', () => {
  const fixed = { capacity: 5, refillPerSecond: 1 };
  it.each<[string, RateLimitPolicy, boolean]>([
    ['not for a per-IP policy with fixed numbers', { ...fixed }, false],
    ["not for keyBy 'ip' written out", { ...fixed, keyBy: 'ip' }, false],
    ['not for a per-IP policy with a resolver (decided before the guards)', { ...fixed, resolve: Plans }, false],
    ["not for keyBy 'user' with phase 'before-guards'", { ...fixed, keyBy: 'user', phase: 'before-guards' }, false],
    ["for keyBy 'user'", { ...fixed, keyBy: 'user' }, true],
    ["for keyBy 'apiKey' (keys.apiKey may be set)", { ...fixed, keyBy: 'apiKey' }, true],
    ['for a keyBy function', { ...fixed, keyBy: () => 'tenant' }, true],
    ['for a per-IP policy with a cost function', { ...fixed, cost: () => 2 }, true],
    ['for a per-IP policy with a capacity function', { capacity: () => 5, refillPerSecond: 1 }, true],
    ['for a per-IP policy with a refillPerSecond function', { capacity: 5, refillPerSecond: () => 1 }, true],
    ["for a per-IP policy with phase 'after-guards'", { ...fixed, phase: 'after-guards' }, true],
    ['for a per-IP policy with refundOn', { ...fixed, refundOn: 'success' }, true],
    ["for a policy with refundOn and phase 'before-guards'", { ...fixed, refundOn: 'failure', phase: 'before-guards' }, true],
  ])('%s', (_, policy, expected) => {
    expect(applied(policy)).toBe(expected);
  });
});
