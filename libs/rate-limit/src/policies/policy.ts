import type { BucketPolicy, KeyBy, PolicyPhase, RateLimitPolicy } from '../rate-limit.interfaces.js';
import { SAFE_IDENTITY } from '../rate-limit.constants.js';
import { MAX_CAPACITY, MAX_WINDOW_SECONDS } from '../bucket/token-bucket.js';

const KEY_BY_NAMES: readonly string[] = ['ip', 'user', 'apiKey'];
const PHASES: readonly string[] = ['before-guards', 'after-guards'];

/** A route policy checked and resolved once, at start-up. */
export interface CompiledPolicy extends BucketPolicy {
  cost: number;
  keyBy: KeyBy;
  /** The policy `name`, or `Controller.handler`: the bucket's scope and its draft-8 name. */
  scope: string;
  /** What follows the identity in the key: `}:<scope>`. */
  keySuffix: string;
  /** Decided by the guard (before the app's guards) or by the interceptor (after them). */
  phase: PolicyPhase;
}

/** What compiling a route policy needs to know of the module options. */
export interface PolicyContext {
  /** `keys.apiKey` is set: API keys are verified by the app, after its guards. */
  apiKeyVerified: boolean;
}

/**
 * The phase a policy is decided in when it names none: before the app's guards when its identity is on
 * the raw request (the IP, an unverified API key header), after them when the app's guards or hooks
 * establish it (the user, a verified key, whatever a keyBy function reads).
 */
function defaultPhase(keyBy: KeyBy, context: PolicyContext): PolicyPhase {
  if (keyBy === 'ip') return 'before-guards';
  if (keyBy === 'apiKey') return context.apiKeyVerified ? 'after-guards' : 'before-guards';
  return 'after-guards';
}

/** The phase a policy is decided in (its own `phase`, else the default for its keyBy). */
export function phaseOf(policy: RateLimitPolicy, context: PolicyContext): PolicyPhase {
  return policy.phase ?? defaultPhase(policy.keyBy ?? 'ip', context);
}

/**
 * Whether a policy may be decided after the app's guards, whatever the module options: what
 * `@RateLimit` needs to know to apply `RateLimitInterceptor` only where it has work.
 */
export function mayDecideAfterGuards(policy: RateLimitPolicy): boolean {
  return policy.phase === undefined ? (policy.keyBy ?? 'ip') !== 'ip' : policy.phase === 'after-guards';
}

function describe(value: unknown): string {
  return typeof value === 'string' ? JSON.stringify(value) : String(value);
}

/**
 * Checks the bucket numbers; `where` names the route or call in the error. Bounds: capacity an integer
 * from 1 to `MAX_CAPACITY` (1e12), refill finite and > 0, and the window capacity / refill at most
 * `MAX_WINDOW_SECONDS` (1e12 s): numbers for which the arithmetic stays exact and the script's
 * PEXPIRE argument is an integer Redis accepts.
 */
export function assertBucketPolicy(policy: BucketPolicy, where: string, label = '@RateLimit'): void {
  if (typeof policy !== 'object' || policy === null) {
    throw new Error(`${label} needs { capacity, refillPerSecond } (got ${describe(policy)}) on ${where}`);
  }
  const { capacity, refillPerSecond } = policy;
  if (typeof capacity !== 'number' || !Number.isInteger(capacity) || capacity < 1) {
    throw new Error(`${label} capacity must be an integer >= 1 (got ${describe(capacity)}) on ${where}`);
  }
  if (capacity > MAX_CAPACITY) {
    throw new Error(`${label} capacity must be at most ${MAX_CAPACITY} (got ${describe(capacity)}) on ${where}`);
  }
  if (typeof refillPerSecond !== 'number' || !Number.isFinite(refillPerSecond) || refillPerSecond <= 0) {
    throw new Error(
      `${label} refillPerSecond must be a finite number > 0 (got ${describe(refillPerSecond)}) on ${where}`,
    );
  }
  // The time an empty bucket takes to fill; the bucket's TTL is twice it (see MAX_WINDOW_SECONDS).
  const window = capacity / refillPerSecond;
  if (!(window <= MAX_WINDOW_SECONDS)) {
    throw new Error(
      `${label} window capacity / refillPerSecond must be at most ${MAX_WINDOW_SECONDS} s (got ${Number(window.toPrecision(6))} s) on ${where}`,
    );
  }
}

/** Checks a cost against its bucket. */
export function assertCost(cost: unknown, capacity: number, where: string, label = '@RateLimit'): void {
  if (typeof cost !== 'number' || !Number.isInteger(cost) || cost < 1 || cost > capacity) {
    throw new Error(
      `${label} cost must be an integer from 1 to capacity ${capacity} (got ${describe(cost)}) on ${where}`,
    );
  }
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
  assertBucketPolicy(policy, route, label);
  const cost = policy.cost ?? 1;
  assertCost(cost, policy.capacity, route, label);
  const keyBy = policy.keyBy ?? 'ip';
  if (typeof keyBy !== 'function' && !KEY_BY_NAMES.includes(keyBy)) {
    throw new Error(
      `${label} keyBy must be 'ip', 'user', 'apiKey' or a function (got ${describe(keyBy)}) on ${route}`,
    );
  }
  if (policy.name !== undefined && (typeof policy.name !== 'string' || !SAFE_IDENTITY.test(policy.name))) {
    throw new Error(
      `${label} name must be 1-64 characters of A-Z a-z 0-9 . _ : @ - (got ${describe(policy.name)}) on ${route}`,
    );
  }
  if (policy.phase !== undefined && !PHASES.includes(policy.phase)) {
    throw new Error(`${label} phase must be 'before-guards' or 'after-guards' (got ${describe(policy.phase)}) on ${route}`);
  }
  const scope = policy.name ?? defaultScope;
  return {
    capacity: policy.capacity,
    refillPerSecond: policy.refillPerSecond,
    cost,
    keyBy,
    scope,
    keySuffix: `}:${scope}`,
    phase: phaseOf(policy, context),
  };
}
