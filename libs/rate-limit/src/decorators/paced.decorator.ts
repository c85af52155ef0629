import { markPaced, pacedTargetOf } from '../bucket/active-bucket-service.js';
import { assertBucketPolicy, assertCost, describe, describeValue } from '../bucket/bucket-policy.check.js';
import type { BucketService } from '../bucket/bucket.service.js';
import { RateLimitConfigError, RateLimitError } from '../errors/rate-limit.errors.js';
import type { FailureMode } from '../rate-limit.options.js';
import { keysOf, unknownKeyOf } from '../unknown-keys.js';

/** Options of `@Paced`: the bucket, its numbers, and how long a call may wait. `Args`: the method's arguments. */
export interface PacedOptions<Args extends unknown[] = any[]> {
  /** The bucket's name (shared by every instance), or a function of the call's arguments that answers it. */
  name: string | ((...args: Args) => string);
  /** Most tokens the bucket holds (the burst). */
  capacity: number;
  /** Tokens added per second (the pace). */
  refillPerSecond: number;
  /** Tokens a call waits for, or a function of its arguments; default 1. */
  cost?: number | ((...args: Args) => number);
  /** The longest a call waits, in ms; a longer wait rejects at once (`RateLimitWaitTooLongError`). Default the module's `acquire.maxWaitMs`. */
  maxWaitMs?: number;
  /** What a call gets when Redis fails; default the module's `failureMode`. */
  failureMode?: FailureMode;
}

const PACED_KEYS = keysOf<keyof PacedOptions>({
  name: true,
  capacity: true,
  refillPerSecond: true,
  cost: true,
  maxWaitMs: true,
  failureMode: true,
});

/**
 * Paces a method of any provider (an outbound API client, a queue processor, a cron handler): each call
 * first waits for its tokens with `BucketService.acquire()`, then runs, so that all instances together
 * call it at most `capacity` at once and `refillPerSecond` per second after that, first come first served.
 * A call whose wait would exceed `maxWaitMs` rejects without running the method. The method is wrapped
 * where it is declared (schedulers and queue workers that keep a reference taken at start-up call the
 * wrapper), and always returns a Promise. The `BucketService` is found at call time, from the instance:
 * the one of the application whose module created it (so two applications in one process each pace with
 * their own prefix and Redis; a call on an instance of a closed application rejects with
 * `ERR_RATE_LIMIT_SHUTTING_DOWN`). An instance Nest did not create (`new`, request-scoped, a static
 * method) uses the only application that runs: without one a call rejects with
 * `ERR_RATE_LIMIT_MODULE_NOT_IMPORTED`, with several with `ERR_RATE_LIMIT_PACED_UNBOUND`. Metadata of
 * decorators applied before it (listed below it, such as `@Cron`) is carried over to the wrapper.
 */
export function Paced<Args extends unknown[] = any[]>(options: PacedOptions<Args>): MethodDecorator {
  return (target: object, key: string | symbol, descriptor: PropertyDescriptor) => {
    const where = `@Paced on ${target.constructor?.name ?? 'a class'}.${String(key)}`;
    checkOptions(options, where);
    const method = descriptor.value as (...args: Args) => unknown;
    if (typeof method !== 'function') {
      throw new RateLimitConfigError('ERR_RATE_LIMIT_INVALID_OPTION', `${where}: @Paced applies to methods only`);
    }
    const { name, capacity, refillPerSecond, cost, maxWaitMs, failureMode } = options;
    const policy = { capacity, refillPerSecond };
    markPaced(target);
    const paced = async function (this: unknown, ...args: Args): Promise<unknown> {
      const service = serviceFor(this, where);
      const bucket = typeof name === 'function' ? name(...args) : name;
      if (typeof bucket !== 'string' || bucket === '') {
        throw new RateLimitConfigError(
          'ERR_RATE_LIMIT_INVALID_POLICY',
          `${where}: name answered ${describeValue(bucket)} for this call, not a bucket name (a non-empty string)`,
        );
      }
      const tokens = typeof cost === 'function' ? cost(...args) : (cost ?? 1);
      await service.acquire(bucket, policy, {
        cost: tokens,
        ...(maxWaitMs === undefined ? {} : { maxWaitMs }),
        ...(failureMode === undefined ? {} : { failureMode }),
      });
      return method.apply(this, args);
    };
    Object.defineProperty(paced, 'name', { value: method.name });
    for (const metadataKey of Reflect.getOwnMetadataKeys(method)) {
      Reflect.defineMetadata(metadataKey, Reflect.getOwnMetadata(metadataKey, method), paced);
    }
    descriptor.value = paced;
    return descriptor;
  };
}

/** The service a call on `instance` uses (see `active-bucket-service.ts`), or the coded error that refuses it. */
function serviceFor(instance: unknown, where: string): BucketService {
  const target = pacedTargetOf<BucketService>(instance);
  if ('service' in target) return target.service;
  if (target.refused === 'closed') {
    throw new RateLimitError(
      'ERR_RATE_LIMIT_SHUTTING_DOWN',
      `${where}: the application that created this instance is closed, so its calls cannot be paced`,
    );
  }
  if (target.refused === 'ambiguous') {
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_PACED_UNBOUND',
      `${where}: this instance was not created by an application (made with new, request-scoped, or a static method) ` +
        `and ${target.applications} applications with RateLimitModule run in this process, so whose limits apply is unknown: ` +
        'make it a provider of the application whose limits it uses',
    );
  }
  throw new RateLimitConfigError(
    'ERR_RATE_LIMIT_MODULE_NOT_IMPORTED',
    `${where}: no application with RateLimitModule is running in this process, so its calls cannot be paced`,
  );
}

function checkOptions(options: PacedOptions, where: string): void {
  if (typeof options !== 'object' || options === null) {
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_INVALID_POLICY',
      `${where} needs { name, capacity, refillPerSecond } (got ${describe(options)})`,
    );
  }
  const unknown = unknownKeyOf(options, PACED_KEYS, 'the options');
  if (unknown !== undefined) throw new RateLimitConfigError('ERR_RATE_LIMIT_UNKNOWN_OPTION', `${where}: ${unknown}`);
  if (!(typeof options.name === 'function' || (typeof options.name === 'string' && options.name !== ''))) {
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_INVALID_POLICY',
      `${where}: name must be a bucket name or a function of the arguments (got ${describe(options.name)})`,
    );
  }
  assertBucketPolicy({ capacity: options.capacity, refillPerSecond: options.refillPerSecond }, where, '@Paced');
  if (options.cost !== undefined && typeof options.cost !== 'function') assertCost(options.cost, options.capacity, where, '@Paced');
}
