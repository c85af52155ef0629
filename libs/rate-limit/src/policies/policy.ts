import type { ExecutionContext, Type } from '@nestjs/common';
import type {
  BucketPolicy,
  KeyBy,
  LeaseSettings,
  PolicyPhase,
  RateLimitPolicy,
  RateLimitResolver,
  RefundOn,
} from '../rate-limit.interfaces.js';
import { SAFE_IDENTITY } from '../rate-limit.constants.js';
import { MAX_CAPACITY, MAX_WINDOW_SECONDS } from '../stores/token-bucket.js';
import { assertBucketPolicy, assertCost, describe } from '../bucket/bucket-policy.check.js';
import { type AllKeys, keysOf, unknownKeyOf } from '../unknown-keys.js';
import { RateLimitConfigError } from '../errors/rate-limit.errors.js';
import { leaseConflict, resolveLease } from './lease-option.js';
import { type CompiledPriority, compilePriority } from '../bucket/priority-option.js';

const KEY_BY_NAMES: readonly string[] = ['ip', 'user', 'apiKey'];
const PHASES: readonly string[] = ['before-guards', 'after-guards'];
const POLICY_KEYS = keysOf<AllKeys<RateLimitPolicy>>({
  capacity: true,
  refillPerSecond: true,
  resolve: true,
  keyBy: true,
  cost: true,
  name: true,
  phase: true,
  refundOn: true,
  blockSeconds: true,
  skipIf: true,
  enforce: true,
  lease: true,
  priority: true,
  reserve: true,
});

/** What a policy computes per request instead of fixing at start-up. */
export interface DynamicLimits {
  capacity?: (context: ExecutionContext) => number | Promise<number>;
  refillPerSecond?: (context: ExecutionContext) => number | Promise<number>;
  cost?: (context: ExecutionContext) => number | Promise<number>;
  resolve?: Type<RateLimitResolver>;
  /** `cost` is the policy's own function of the request (not its fixed cost): an invalid answer is a 400, the client's input. */
  costFromRequest: boolean;
  /** The static numbers to use when the request's cannot be had: undefined refuses such a request with 500. */
  fallback?: BucketPolicy & { cost: number };
}

/** A route policy checked and resolved once, at start-up. */
export interface CompiledPolicy extends BucketPolicy {
  /** For a dynamic policy, these numbers are its fallback's, or 0 when it has none: use `dynamic`. */
  cost: number;
  keyBy: KeyBy;
  /** The policy `name`, or `Controller.handler`: the bucket's scope and its draft-8 name. */
  scope: string;
  /** What follows the identity in the key: `}:<scope>`. */
  keySuffix: string;
  /** Decided by the guard (before the app's guards) or by the interceptor (after them). */
  phase: PolicyPhase;
  /** Numbers computed per request; undefined for a static policy (the usual case). */
  dynamic: DynamicLimits | undefined;
  /** Outcomes that give the tokens back after the handler; undefined: none. */
  refundOn: RefundOn | undefined;
  /** Penalty of a refusal, in seconds; 0: none. */
  blockSeconds: number;
  /**
   * The cost a penalty gives back after `blockSeconds`: the policy's fixed `cost` (default 1), or 1 when
   * the cost is a function. Never the refused request's own cost, which a client may choose.
   */
  penaltyCost: number;
  skipIf: ((context: ExecutionContext) => boolean | Promise<boolean>) | undefined;
  /** False: shadow mode (decided and drained, never refused). */
  enforce: boolean;
  /** Leased mode (`lease`): undefined, exact (one call per decision). */
  lease: LeaseSettings | undefined;
  /** The request's priority and the reserve of each level (`priority`, `reserve`); undefined: none (takes to the last token). */
  priority: CompiledPriority | undefined;
}

/** What compiling a route policy needs to know of the module options. */
export interface PolicyContext {
  /** `keys.apiKey` is set: API keys are verified by the app, after its guards. */
  apiKeyVerified: boolean;
  /** The module's `enforce`: what a policy without its own gets. Default true. */
  enforce?: boolean;
  /** The module's `lease`, resolved: what a policy without its own gets. Default: none. */
  lease?: LeaseSettings;
}

/**
 * The phase a policy is decided in when it names none: before the app's guards when its identity is on
 * the raw request (the IP, an unverified API key header), after them when the app's guards or hooks
 * establish it (the user, a verified key, whatever a keyBy function reads).
 */
function defaultPhase(policy: RateLimitPolicy, context: Pick<PolicyContext, 'apiKeyVerified'>): PolicyPhase {
  // Numbers computed from the request read what the app's guards set (the user's plan).
  if (hasNumberFunction(policy)) return 'after-guards';
  const keyBy = policy.keyBy ?? 'ip';
  if (keyBy === 'ip') return 'before-guards';
  if (keyBy === 'apiKey') return context.apiKeyVerified ? 'after-guards' : 'before-guards';
  return 'after-guards';
}

/** The phase a policy is decided in (its own `phase`, else the default for its keyBy). */
export function phaseOf(policy: RateLimitPolicy, context: Pick<PolicyContext, 'apiKeyVerified'>): PolicyPhase {
  return policy.phase ?? defaultPhase(policy, context);
}

function hasNumberFunction(policy: RateLimitPolicy): boolean {
  return typeof policy.capacity === 'function' || typeof policy.refillPerSecond === 'function' || typeof policy.cost === 'function';
}

/**
 * Whether a policy may be decided after the app's guards, whatever the module options: what
 * `@RateLimit` needs to know to apply `RateLimitInterceptor` only where it has work.
 */
export function mayDecideAfterGuards(policy: RateLimitPolicy): boolean {
  if (policy.phase !== undefined) return policy.phase === 'after-guards';
  return (policy.keyBy ?? 'ip') !== 'ip' || hasNumberFunction(policy);
}

/** Whether `RateLimitInterceptor` has work on a route with this policy: a decision after the app's guards, or a refund after the handler. */
export function needsInterceptor(policy: RateLimitPolicy): boolean {
  return mayDecideAfterGuards(policy) || policy.refundOn !== undefined;
}

/**
 * Validates a route policy and resolves its defaults; throws an error that names the route.
 * `defaultScope` is the bucket scope of an unnamed policy.
 */
export function compilePolicy(
  policy: RateLimitPolicy,
  route: string,
  context: PolicyContext,
  defaultScope = route,
  label = '@RateLimit',
): CompiledPolicy {
  if (typeof policy !== 'object' || policy === null) {
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_INVALID_POLICY',
      `${label} needs { capacity, refillPerSecond } or { resolve } (got ${describe(policy)}) on ${route}`,
    );
  }
  // A policy kept in a variable escapes TypeScript's excess-property check: an unknown key is found here.
  const unknown = unknownKeyOf(policy, POLICY_KEYS, 'the policy');
  if (unknown !== undefined) throw new RateLimitConfigError('ERR_RATE_LIMIT_UNKNOWN_OPTION', `${label} ${unknown} on ${route}`);
  const dynamic = compileDynamic(policy, route, label);
  let numbers: BucketPolicy & { cost: number };
  if (dynamic === undefined) {
    assertBucketPolicy(policy as BucketPolicy, route, label);
    const cost = policy.cost ?? 1;
    assertCost(cost, policy.capacity as number, route, label);
    numbers = { capacity: policy.capacity as number, refillPerSecond: policy.refillPerSecond as number, cost: cost as number };
  } else {
    numbers = dynamic.fallback ?? { capacity: 0, refillPerSecond: 0, cost: 0 };
  }
  const keyBy = policy.keyBy ?? 'ip';
  if (typeof keyBy !== 'function' && !KEY_BY_NAMES.includes(keyBy)) {
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_INVALID_POLICY',
      `${label} keyBy must be 'ip', 'user', 'apiKey' or a function (got ${describe(keyBy)}) on ${route}`,
    );
  }
  if (policy.name !== undefined && (typeof policy.name !== 'string' || !SAFE_IDENTITY.test(policy.name))) {
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_INVALID_POLICY',
      `${label} name must be 1-64 characters of A-Z a-z 0-9 . _ : @ - (got ${describe(policy.name)}) on ${route}`,
    );
  }
  if (policy.phase !== undefined && !PHASES.includes(policy.phase)) {
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_INVALID_POLICY',
      `${label} phase must be 'before-guards' or 'after-guards' (got ${describe(policy.phase)}) on ${route}`,
    );
  }
  const { refundOn, skipIf, enforce } = policy;
  if (refundOn !== undefined && refundOn !== 'success' && refundOn !== 'failure' && typeof refundOn !== 'function') {
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_INVALID_POLICY',
      `${label} refundOn must be 'success', 'failure' or a function (status, error) => boolean (got ${describe(refundOn)}) on ${route}`,
    );
  }
  if (skipIf !== undefined && typeof skipIf !== 'function') {
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_INVALID_POLICY',
      `${label} skipIf must be a function (context) => boolean (got ${describe(skipIf)}) on ${route}`,
    );
  }
  if (enforce !== undefined && typeof enforce !== 'boolean') {
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_INVALID_POLICY',
      `${label} enforce must be true or false (got ${describe(enforce)}) on ${route}`,
    );
  }
  const blockSeconds = policy.blockSeconds ?? 0;
  if (policy.blockSeconds !== undefined) assertBlockSeconds(blockSeconds, numbers, dynamic !== undefined, route, label);
  const lease = policy.lease === undefined ? context.lease : resolveLease(policy.lease, route, label);
  const priority = compilePriority(policy.priority, policy.reserve, route, label);
  const conflict = lease === undefined ? undefined : leaseConflict({ blockSeconds, dynamic, priority });
  if (conflict !== undefined) {
    const whose = policy.lease === undefined ? " (the module's lease applies to it: give it lease: false)" : '';
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_LEASE_UNSUPPORTED',
      `${label} lease cannot be used with ${conflict} on ${route}${whose}`,
    );
  }
  const scope = policy.name ?? defaultScope;
  return {
    ...numbers,
    keyBy,
    scope,
    keySuffix: `}:${scope}`,
    phase: phaseOf(policy, context),
    dynamic,
    refundOn,
    blockSeconds,
    penaltyCost: typeof policy.cost === 'number' ? policy.cost : 1,
    skipIf,
    enforce: enforce ?? context.enforce ?? true,
    lease,
    priority,
  };
}

/**
 * The penalty: a positive finite number of seconds at most `MAX_WINDOW_SECONDS`. For a static policy, the
 * tokens a penalty withholds (`blockSeconds * refillPerSecond`) stay at most `MAX_CAPACITY`, so negative
 * token counts are as exact as positive ones; a dynamic policy's numbers are checked per request.
 */
export function assertBlockSeconds(
  blockSeconds: unknown,
  policy: BucketPolicy | undefined,
  dynamic: boolean,
  where: string,
  label = '@RateLimit',
): void {
  if (typeof blockSeconds !== 'number' || !Number.isFinite(blockSeconds) || blockSeconds <= 0 || blockSeconds > MAX_WINDOW_SECONDS) {
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_INVALID_POLICY',
      `${label} blockSeconds must be a number > 0 and at most ${MAX_WINDOW_SECONDS} (got ${describe(blockSeconds)}) on ${where}`,
    );
  }
  if (!dynamic && policy !== undefined && blockSeconds * policy.refillPerSecond > MAX_CAPACITY) {
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_INVALID_POLICY',
      `${label} blockSeconds * refillPerSecond must be at most ${MAX_CAPACITY} tokens (got ${Number((blockSeconds * policy.refillPerSecond).toPrecision(6))}) on ${where}`,
    );
  }
}

/** The per-request parts of a policy, checked for shape; undefined when every number is fixed. */
function compileDynamic(policy: RateLimitPolicy, route: string, label: string): DynamicLimits | undefined {
  const { capacity, refillPerSecond, cost, resolve } = policy;
  if (resolve !== undefined) {
    if (typeof resolve !== 'function' || typeof resolve.prototype?.resolve !== 'function') {
      throw new RateLimitConfigError(
        'ERR_RATE_LIMIT_INVALID_POLICY',
        `${label} resolve must be a class with a resolve(identity, context) method (got ${describe(resolve)}) on ${route}`,
      );
    }
    if (typeof capacity === 'function' || typeof refillPerSecond === 'function') {
      throw new RateLimitConfigError(
        'ERR_RATE_LIMIT_INVALID_POLICY',
        `${label} with resolve takes numbers, not functions, for capacity and refillPerSecond (its fallback) on ${route}`,
      );
    }
    let fallback: (BucketPolicy & { cost: number }) | undefined;
    if (capacity !== undefined || refillPerSecond !== undefined) {
      assertBucketPolicy({ capacity, refillPerSecond } as BucketPolicy, `${route} (fallback of resolve)`, label);
      const fallbackCost = typeof cost === 'number' ? cost : 1;
      assertCost(fallbackCost, capacity as number, `${route} (fallback of resolve)`, label);
      fallback = { capacity: capacity as number, refillPerSecond: refillPerSecond as number, cost: fallbackCost };
    }
    if (cost !== undefined && typeof cost !== 'function') assertCost(cost, fallback?.capacity ?? MAX_CAPACITY, route, label);
    return { resolve, cost: typeof cost === 'function' ? cost : undefined, costFromRequest: typeof cost === 'function', fallback };
  }
  if (typeof capacity !== 'function' && typeof refillPerSecond !== 'function' && typeof cost !== 'function') return undefined;
  // Mixed: the fixed numbers are checked now, the functions' answers per request.
  if (
    typeof capacity !== 'function' &&
    (typeof capacity !== 'number' || !Number.isInteger(capacity) || capacity < 1 || capacity > MAX_CAPACITY)
  ) {
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_INVALID_POLICY',
      `${label} capacity must be an integer from 1 to ${MAX_CAPACITY} or a function (got ${describe(capacity)}) on ${route}`,
    );
  }
  if (
    typeof refillPerSecond !== 'function' &&
    (typeof refillPerSecond !== 'number' || !Number.isFinite(refillPerSecond) || refillPerSecond <= 0)
  ) {
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_INVALID_POLICY',
      `${label} refillPerSecond must be a finite number > 0 or a function (got ${describe(refillPerSecond)}) on ${route}`,
    );
  }
  if (cost !== undefined && typeof cost !== 'function' && (typeof cost !== 'number' || !Number.isInteger(cost) || cost < 1)) {
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_INVALID_POLICY',
      `${label} cost must be an integer >= 1 or a function (got ${describe(cost)}) on ${route}`,
    );
  }
  const fixed = (value: unknown) => () => value as number;
  return {
    capacity: typeof capacity === 'function' ? capacity : fixed(capacity),
    refillPerSecond: typeof refillPerSecond === 'function' ? refillPerSecond : fixed(refillPerSecond),
    cost: typeof cost === 'function' ? cost : fixed(cost ?? 1),
    costFromRequest: typeof cost === 'function',
    fallback: undefined,
  };
}
