/**
 * Which `BucketService` a `@Paced` method calls. A decorator wraps a method when its class is declared,
 * long before any module exists, so the wrapper finds the service at call time, from the instance it is
 * called on (`this`):
 * - an instance Nest created (a provider, controller or enhancer of an application, static or transient)
 *   is bound, when that application's `RateLimitModule` initialises, to that application's service: two
 *   applications in one process (a test beside another, an app and its worker) each pace with their own
 *   prefix, Redis and options, whichever started last, and an instance of a closed application is
 *   refused rather than sent to another one;
 * - any other `this` (an instance made with `new`, a request-scoped instance, a static method) uses the
 *   service of the only application that runs; with none, or with several (whose limits would it be?),
 *   the call is refused.
 */

/** One application's service, as the instances it created see it. */
export interface PacedBinding {
  readonly service: object;
  /** False once the application is closing: its instances' calls are refused. */
  open: boolean;
}

/** Where `@Paced` methods are declared: prototypes (instance methods) and classes (static ones). */
const pacedOwners = new WeakSet<object>();
/** The instances Nest created, each with the application that created it. */
const bindings = new WeakMap<object, PacedBinding>();
/** The services of the applications that run now, in the order they started. */
const running = new Set<object>();

/** Marks `owner` (a prototype, or a class for a static method) as declaring a `@Paced` method. */
export function markPaced(owner: object): void {
  pacedOwners.add(owner);
}

/** Whether `value` has a `@Paced` method of its own class or of a class it extends. */
export function hasPacedMethods(value: unknown): value is object {
  for (let at: unknown = value; at !== null && (typeof at === 'object' || typeof at === 'function'); at = Object.getPrototypeOf(at)) {
    if (pacedOwners.has(at as object)) return true;
  }
  return false;
}

/** Binds the instances an application created (those with `@Paced` methods) to its service. */
export function bindPacedInstances(instances: Iterable<unknown>, binding: PacedBinding): void {
  for (const instance of instances) if (hasPacedMethods(instance)) bindings.set(instance, binding);
}

/** Sets (`on`) or clears a service of a running application. */
export function setRunningBucketService(service: object, on: boolean): void {
  if (on) running.add(service);
  else running.delete(service);
}

/** What a `@Paced` call on `instance` uses, or why it cannot be paced. */
export type PacedTarget<T> = { service: T } | { refused: 'closed' } | { refused: 'none' } | { refused: 'ambiguous'; applications: number };

export function pacedTargetOf<T extends object>(instance: unknown): PacedTarget<T> {
  const bound = typeof instance === 'object' && instance !== null ? bindings.get(instance) : undefined;
  if (bound !== undefined) return bound.open ? { service: bound.service as T } : { refused: 'closed' };
  if (running.size === 1) return { service: running.values().next().value as T };
  return running.size === 0 ? { refused: 'none' } : { refused: 'ambiguous', applications: running.size };
}

/**
 * The instances of an application's modules (`ModulesContainer` of `@nestjs/core`, read through the
 * members Nest 10 to 12 share): each static provider, controller and enhancer, and the instances a
 * transient provider made for its consumers.
 */
export function instancesOf(modules: Iterable<unknown>): unknown[] {
  const instances: unknown[] = [];
  for (const module of modules) {
    const { providers, controllers, injectables } = (module ?? {}) as Record<string, Map<unknown, unknown> | undefined>;
    for (const wrappers of [providers, controllers, injectables]) {
      if (!(wrappers instanceof Map)) continue;
      for (const wrapper of wrappers.values()) {
        const w = wrapper as {
          instance?: unknown;
          isTransient?: boolean;
          getStaticTransientInstances?: () => ({ instance?: unknown } | undefined)[];
        };
        if (w.isTransient === true && typeof w.getStaticTransientInstances === 'function') {
          for (const each of w.getStaticTransientInstances()) if (each?.instance !== undefined) instances.push(each.instance);
        } else {
          instances.push(w.instance);
        }
      }
    }
  }
  return instances;
}
