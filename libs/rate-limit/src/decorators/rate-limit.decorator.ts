import { EXCEPTION_FILTERS_METADATA, INTERCEPTORS_METADATA } from '@nestjs/common/constants.js';
import { RateLimitModuleCheck } from '../filters/rate-limit-module.check.js';
import { RateLimitInterceptor } from '../interceptors/rate-limit.interceptor.js';
import { needsInterceptor } from '../policies/policy.js';
import { RATE_LIMIT_POLICIES } from '../rate-limit.constants.js';
import type { KeyBy, RateLimitPolicy } from '../rate-limit.interfaces.js';

/**
 * Limits a controller or a handler with a token bucket: `capacity` tokens at most (the burst), refilled
 * at `refillPerSecond`. Stack several to enforce several policies at once; all must allow. Policies on
 * a handler replace those on its controller. Policies are validated at start-up. A policy that may be
 * decided after the app's guards (`phase: 'after-guards'`; without a phase, a keyBy other than `'ip'` or
 * a `capacity`, `refillPerSecond` or `cost` function) or that refunds after the handler (`refundOn`)
 * also applies `RateLimitInterceptor` to what it decorates, once; every `@RateLimit` also registers
 * `RateLimitModuleCheck`, which fails the start of an app that lacks `RateLimitModule`.
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
    appendOnce(EXCEPTION_FILTERS_METADATA, RateLimitModuleCheck, holder);
    // Only where a policy may wait for the app's guards or refund after the handler: Nest's interceptor
    // pipeline costs every request it runs on, and per-IP policies are decided (and their headers
    // written) by the guard alone.
    if (needsInterceptor(policy)) appendOnce(INTERCEPTORS_METADATA, RateLimitInterceptor, holder);
  };
}

/** Adds an enhancer to the list Nest reads from `target` (as `@UseInterceptors()` would), unless it is there. */
export function appendOnce(key: string, enhancer: Function, target: object): void {
  const list: unknown[] = Reflect.getMetadata(key, target) ?? [];
  if (!list.includes(enhancer)) Reflect.defineMetadata(key, [...list, enhancer], target);
}
