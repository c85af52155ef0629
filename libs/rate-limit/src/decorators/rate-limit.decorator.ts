import { INTERCEPTORS_METADATA } from '@nestjs/common/constants.js';
import { RateLimitInterceptor } from '../interceptors/rate-limit.interceptor.js';
import { RATE_LIMIT_POLICIES } from '../rate-limit.constants.js';
import type { KeyBy, RateLimitPolicy } from '../rate-limit.interfaces.js';

/**
 * Limits a controller or a handler with a token bucket: `capacity` tokens at most (the burst), refilled
 * at `refillPerSecond`. Stack several to enforce several policies at once; all must allow. Policies on
 * a handler replace those on its controller. Policies are validated at start-up. Also applies
 * `RateLimitInterceptor` to what it decorates (once), which decides the policies that need the app's
 * guards and writes the headers.
 */
export function RateLimit(capacity: number, refillPerSecond: number, keyBy?: KeyBy): ClassDecorator & MethodDecorator;
export function RateLimit(policy: RateLimitPolicy): ClassDecorator & MethodDecorator;
export function RateLimit(
  capacityOrPolicy: number | RateLimitPolicy,
  refillPerSecond?: number,
  keyBy?: KeyBy,
): ClassDecorator & MethodDecorator {
  const policy: RateLimitPolicy =
    typeof capacityOrPolicy === 'object' && capacityOrPolicy !== null
      ? { ...capacityOrPolicy }
      : ({ capacity: capacityOrPolicy, refillPerSecond, keyBy } as RateLimitPolicy);
  return (target: object, _key?: string | symbol, descriptor?: PropertyDescriptor) => {
    const holder: object = descriptor ? descriptor.value : target;
    const own: RateLimitPolicy[] = Reflect.getOwnMetadata(RATE_LIMIT_POLICIES, holder) ?? [];
    // Decorators apply bottom-up: prepend, so the stored order is the order written.
    Reflect.defineMetadata(RATE_LIMIT_POLICIES, [policy, ...own], holder);
    const interceptors: unknown[] = Reflect.getMetadata(INTERCEPTORS_METADATA, holder) ?? [];
    if (!interceptors.includes(RateLimitInterceptor)) {
      Reflect.defineMetadata(INTERCEPTORS_METADATA, [...interceptors, RateLimitInterceptor], holder);
    }
  };
}
