/**
 * The `BucketService` of the application that started last in this process, for `@Paced` methods: a
 * decorator wraps a method when its class is declared, long before any module exists, so the wrapper
 * finds the service at call time. Set when the module initialises, cleared when it is destroyed.
 */
let active: object | undefined;

/** Sets (`on`) or clears the active service; clearing leaves a newer application's service in place. */
export function setActiveBucketService(service: object, on: boolean): void {
  if (on) active = service;
  else if (active === service) active = undefined;
}

/** The active service, or undefined when no application with `RateLimitModule` has started (or all were closed). */
export function activeBucketService<T extends object>(): T | undefined {
  return active as T | undefined;
}
