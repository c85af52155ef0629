import { RateLimitConfigError } from '../errors/rate-limit.errors.js';
import type { RateLimitModuleOptions, RateLimitOperationsOptions, ResolvedOperationsOptions } from '../rate-limit.options.js';
import { keysOf, unknownKeyOf } from '../unknown-keys.js';

export const DEFAULT_SYNC_MS = 1000;
export const DEFAULT_TOP_K = 1000;
export const DEFAULT_RETENTION_HOURS = 24;

const OPERATIONS_KEYS = keysOf<keyof RateLimitOperationsOptions>({ analytics: true, syncMs: true, blockedStatus: true });
const ANALYTICS_KEYS = ['topK', 'retentionHours'] as const;

const OFF: ResolvedOperationsOptions = {
  enabled: false,
  analytics: { enabled: false, topK: DEFAULT_TOP_K, retentionHours: DEFAULT_RETENTION_HOURS },
  syncMs: DEFAULT_SYNC_MS,
  blockedStatus: 429,
};

function invalid(message: string): RateLimitConfigError {
  return new RateLimitConfigError('ERR_RATE_LIMIT_INVALID_OPTION', `RateLimitModule: ${message}`);
}

function integer(name: string, value: unknown, fallback: number, min: number, max: number): number {
  if (value === undefined) return fallback;
  if (typeof value === 'number' && Number.isSafeInteger(value) && value >= min && value <= max) return value;
  throw invalid(`${name} must be an integer from ${min} to ${max} (got ${JSON.stringify(value)})`);
}

/** Checks `operations` as strictly as the rest of the options: unknown keys, types and ranges. */
export function resolveOperations(value: RateLimitModuleOptions['operations']): ResolvedOperationsOptions {
  if (value === undefined || value === false) return OFF;
  if (value === true) return { ...OFF, enabled: true, analytics: { ...OFF.analytics, enabled: true } };
  if (typeof value !== 'object' || value === null || Array.isArray(value)) {
    throw invalid(`operations must be true, false or { analytics?, syncMs?, blockedStatus? } (got ${JSON.stringify(value)})`);
  }
  const unknown = unknownKeyOf(value, OPERATIONS_KEYS, 'operations');
  if (unknown !== undefined) throw new RateLimitConfigError('ERR_RATE_LIMIT_UNKNOWN_OPTION', `RateLimitModule: ${unknown}`);
  const analytics = value.analytics ?? true;
  if (typeof analytics !== 'boolean' && (typeof analytics !== 'object' || analytics === null || Array.isArray(analytics))) {
    throw invalid(`operations.analytics must be true, false or { topK?, retentionHours? } (got ${JSON.stringify(analytics)})`);
  }
  const shape = typeof analytics === 'object' ? analytics : {};
  const unknownAnalytics = unknownKeyOf(shape, ANALYTICS_KEYS, 'operations.analytics');
  if (unknownAnalytics !== undefined)
    throw new RateLimitConfigError('ERR_RATE_LIMIT_UNKNOWN_OPTION', `RateLimitModule: ${unknownAnalytics}`);
  const blockedStatus = value.blockedStatus ?? 429;
  if (blockedStatus !== 429 && blockedStatus !== 403) {
    throw invalid(`operations.blockedStatus must be 429 or 403 (got ${JSON.stringify(blockedStatus)})`);
  }
  return {
    enabled: true,
    analytics: {
      enabled: analytics !== false,
      topK: integer('operations.analytics.topK', shape.topK, DEFAULT_TOP_K, 10, 10_000),
      retentionHours: integer('operations.analytics.retentionHours', shape.retentionHours, DEFAULT_RETENTION_HOURS, 1, 168),
    },
    syncMs: integer('operations.syncMs', value.syncMs, DEFAULT_SYNC_MS, 250, 10_000),
    blockedStatus,
  };
}
