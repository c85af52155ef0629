import type { ExecutionContext } from '@nestjs/common';
import { RateLimitConfigError } from '../errors/rate-limit.errors.js';
import { describe } from './bucket-policy.check.js';
import type { PriorityLevel, PriorityOption, ReserveOption } from '../rate-limit.interfaces.js';

/** The levels, from the one that may go deepest into a bucket to the one refused first. */
export const PRIORITY_LEVELS: readonly PriorityLevel[] = ['critical', 'default', 'sheddable'];

/** The share of the capacity kept from `sheddable` requests when a policy names a priority but no reserve. */
export const DEFAULT_SHEDDABLE_RESERVE = 0.2;

const RESERVE_KEYS: readonly string[] = ['sheddable', 'default'];

/** A policy's priority, checked: its level (or the function that gives it per request) and the share each level leaves. */
export interface CompiledPriority {
  /** The level of every request; undefined when `of` gives it per request. */
  level: PriorityLevel | undefined;
  /** The level of a request, from the policy's function (its answer is checked by the caller). */
  of: ((context: ExecutionContext) => unknown) | undefined;
  /** Per level, the share of the capacity a take must leave (critical: 0). */
  shares: Readonly<Record<PriorityLevel, number>>;
}

function isLevel(value: unknown): value is PriorityLevel {
  return value === 'critical' || value === 'default' || value === 'sheddable';
}

/**
 * A policy's `priority` and `reserve` checked (undefined when it has neither): the level is one of
 * PRIORITY_LEVELS or a function; the reserve a number (the sheddable share) or { sheddable?, default? },
 * with 0 <= default <= sheddable < 1. A priority without a reserve keeps DEFAULT_SHEDDABLE_RESERVE from
 * sheddable requests; `functions`: false for BucketService, whose calls have no request to ask.
 */
export function compilePriority(
  priority: unknown,
  reserve: unknown,
  where: string,
  label: string,
  functions = true,
): CompiledPriority | undefined {
  if (priority === undefined && reserve === undefined) return undefined;
  const levels = "'critical', 'default' or 'sheddable'";
  if (priority !== undefined && !isLevel(priority) && !(functions && typeof priority === 'function')) {
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_INVALID_POLICY',
      `${label} priority must be ${levels}${functions ? ' or a function (context) => level' : ''} (got ${describe(priority)}) on ${where}`,
    );
  }
  const shares = resolveReserve(reserve, where, label);
  return {
    level: typeof priority === 'function' ? undefined : ((priority as PriorityLevel | undefined) ?? 'default'),
    of: typeof priority === 'function' ? (priority as PriorityOption & ((context: ExecutionContext) => unknown)) : undefined,
    shares,
  };
}

function resolveReserve(reserve: unknown, where: string, label: string): Record<PriorityLevel, number> {
  const shape = `${label} reserve must be a share from 0 to below 1 (of the capacity kept from sheddable requests) or { sheddable?, default? } with 0 <= default <= sheddable < 1`;
  if (reserve === undefined) return { critical: 0, default: 0, sheddable: DEFAULT_SHEDDABLE_RESERVE };
  let sheddable: unknown;
  let fallback: unknown = 0;
  if (typeof reserve === 'number') sheddable = reserve;
  else if (typeof reserve === 'object' && reserve !== null && !Array.isArray(reserve)) {
    const unknown = Object.keys(reserve).find((key) => !RESERVE_KEYS.includes(key));
    if (unknown !== undefined) {
      throw new RateLimitConfigError(
        'ERR_RATE_LIMIT_UNKNOWN_OPTION',
        `${label} reserve has no level "${unknown}" (critical keeps no reserve; ${shape.slice(label.length + 1)}) on ${where}`,
      );
    }
    ({ sheddable = DEFAULT_SHEDDABLE_RESERVE, default: fallback = 0 } = reserve as Exclude<ReserveOption, number>);
  } else {
    throw new RateLimitConfigError('ERR_RATE_LIMIT_INVALID_POLICY', `${shape} (got ${describe(reserve)}) on ${where}`);
  }
  const share = (x: unknown) => typeof x === 'number' && x >= 0 && x < 1;
  if (!share(sheddable) || !share(fallback) || (fallback as number) > (sheddable as number)) {
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_INVALID_POLICY',
      `${shape} (got ${describe(reserve)}${typeof reserve === 'object' ? `, that is sheddable ${describe(sheddable)} and default ${describe(fallback)}` : ''}) on ${where}`,
    );
  }
  return { critical: 0, default: fallback as number, sheddable: sheddable as number };
}

/** The tokens a request at `level` must leave in a bucket of `capacity`: its share of it (0: none). */
export function floorOf(priority: CompiledPriority, level: PriorityLevel, capacity: number): number {
  return priority.shares[level] * capacity;
}

export { isLevel as isPriorityLevel };
