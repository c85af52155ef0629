import { EXCEPTION_FILTERS_METADATA, INTERCEPTORS_METADATA } from '@nestjs/common/constants.js';
import { RateLimitModuleCheck } from '../filters/rate-limit-module.check.js';
import { RateLimitInterceptor } from '../interceptors/rate-limit.interceptor.js';
import type { ConcurrencyLimitOptions } from '../policies/concurrency-option.js';
import { RATE_LIMIT_CONCURRENCY } from '../rate-limit.constants.js';
import type { KeyBy } from '../rate-limit.interfaces.js';
import { appendOnce } from './rate-limit.decorator.js';

/**
 * Admits a request only while fewer than `limit` requests of its identity are in flight on all
 * instances (docs/guides/concurrency.md). The slot is taken after the app's guards and after the route's
 * `@RateLimit` policies allowed the request (one store call), and given back when the response is done,
 * whatever way it ends (one more). One per route: on a handler it replaces its controller's. Checked at
 * start-up; applies `RateLimitInterceptor`, which takes and gives back the slot.
 */
export function ConcurrencyLimit(limit: number, keyBy?: KeyBy): ClassDecorator & MethodDecorator;
export function ConcurrencyLimit(options: ConcurrencyLimitOptions): ClassDecorator & MethodDecorator;
export function ConcurrencyLimit(limitOrOptions: number | ConcurrencyLimitOptions, keyBy?: KeyBy): ClassDecorator & MethodDecorator {
  const options: ConcurrencyLimitOptions =
    typeof limitOrOptions === 'object' && limitOrOptions !== null
      ? { ...limitOrOptions }
      : ({ limit: limitOrOptions, ...(keyBy === undefined ? {} : { keyBy }) } as ConcurrencyLimitOptions);
  return (target: object, _key?: string | symbol, descriptor?: PropertyDescriptor) => {
    const holder: object = descriptor ? descriptor.value : target;
    // Two on one target: the registry names the route in its error.
    const own: unknown = Reflect.getOwnMetadata(RATE_LIMIT_CONCURRENCY, holder);
    Reflect.defineMetadata(RATE_LIMIT_CONCURRENCY, own === undefined ? options : [options, own].flat(), holder);
    appendOnce(EXCEPTION_FILTERS_METADATA, RateLimitModuleCheck, holder);
    appendOnce(INTERCEPTORS_METADATA, RateLimitInterceptor, holder);
  };
}
