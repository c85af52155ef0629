import type { KeyBy, RateLimitPolicy } from '../rate-limit.interfaces.js';
import { RATE_LIMIT_POLICIES } from '../rate-limit.constants.js';

/**
 * Limits a controller or a handler with a token bucket: `capacity` tokens at most (the burst), refilled
 * at `refillPerSecond`. Stack several to enforce several policies at once; all must allow. Policies on
 * a handler replace those on its controller. Policies are validated at start-up.
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
      : { capacity: capacityOrPolicy, refillPerSecond: refillPerSecond as number, keyBy };
  return (target: object, _key?: string | symbol, descriptor?: PropertyDescriptor) => {
    const holder = descriptor ? (descriptor.value as object) : target;
    const own: RateLimitPolicy[] = Reflect.getOwnMetadata(RATE_LIMIT_POLICIES, holder) ?? [];
    // Decorators apply bottom-up: prepend, so the stored order is the order written.
    Reflect.defineMetadata(RATE_LIMIT_POLICIES, [policy, ...own], holder);
  };
}
