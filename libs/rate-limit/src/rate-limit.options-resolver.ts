import {
  DEFAULT_ACQUIRE_MAX_WAIT_MS,
  DEFAULT_ACQUIRE_MAX_WAITING,
  DEFAULT_API_KEY_HEADER,
  DEFAULT_KEY_PREFIX,
  DEFAULT_RESOLVER_CACHE_MS,
  DEFAULT_TIMEOUT_MS,
} from './rate-limit.constants.js';
import { isIP } from 'node:net';
import type {
  RateLimitAcquireOptions,
  RateLimitAllowList,
  RateLimitKeyOptions,
  RateLimitModuleOptions,
  ResolvedRateLimitOptions,
} from './rate-limit.options.js';
import { isStoreObject, missingStoreMembers } from './stores/custom-bucket.store.js';
import { DEFAULT_MAX_LOCAL_BUCKETS } from './stores/memory/memory-bucket.store.js';
import { checkRedisOption, undefinedRedisOption } from './stores/redis/redis-options.validation.js';
import { keysOf, unknownKeyOf } from './unknown-keys.js';
import { RateLimitConfigError } from './errors/rate-limit.errors.js';
import { resolveOperations } from './operations/operations-options.js';
import { resolveLease } from './policies/lease-option.js';

/** The most in-process buckets one may ask for: a JavaScript Map holds at most 2^24 entries. */
const MAX_LOCAL_BUCKETS = 2 ** 24;

/** The longest delay a Node timer accepts (2^31 - 1 ms, about 24.8 days). */
const MAX_TIMEOUT_MS = 2 ** 31 - 1;

const STORES = ['redis', 'memory'] as const;
const FAILURE_MODES = ['open', 'closed', 'local'] as const;
const STANDARD_HEADERS = ['draft-6', 'draft-7', 'draft-8', false] as const;
const STARTUP_CHECKS = ['default', 'strict', false] as const;

// Written out as records so that the compiler fails when an interface gains or loses a key and these do not.
const MODULE_KEYS = keysOf<keyof RateLimitModuleOptions>({
  redis: true,
  store: true,
  keyPrefix: true,
  failureMode: true,
  timeoutMs: true,
  legacyHeaders: true,
  standardHeaders: true,
  keys: true,
  defaults: true,
  denyCache: true,
  coalesce: true,
  guard: true,
  enforce: true,
  lease: true,
  skipIf: true,
  allowList: true,
  onDecision: true,
  resolverCacheMs: true,
  maxLocalBuckets: true,
  metrics: true,
  startupCheck: true,
  acquire: true,
  operations: true,
});
const KEY_OPTION_KEYS = keysOf<keyof RateLimitKeyOptions>({ apiKeyHeader: true, user: true, apiKey: true, secret: true });
const ALLOW_LIST_KEYS = keysOf<keyof RateLimitAllowList>({ ips: true, users: true, apiKeys: true });
const ACQUIRE_KEYS = keysOf<keyof RateLimitAcquireOptions>({ maxWaitMs: true, maxWaiting: true });

/** Refuses a key the module does not read: it would be ignored, and the default would stay in force. */
function assertKnownKeys(options: RateLimitModuleOptions): void {
  if (options.keys !== undefined && (typeof options.keys !== 'object' || options.keys === null)) {
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_INVALID_OPTION',
      `RateLimitModule: keys must be { apiKeyHeader?, user?, apiKey?, secret? } (got ${JSON.stringify(options.keys)})`,
    );
  }
  const unknown =
    unknownKeyOf(options, MODULE_KEYS, 'the options') ??
    unknownKeyOf(options.keys, KEY_OPTION_KEYS, 'keys') ??
    unknownKeyOf(options.allowList, ALLOW_LIST_KEYS, 'allowList') ??
    unknownKeyOf(options.acquire, ACQUIRE_KEYS, 'acquire');
  if (unknown !== undefined) throw new RateLimitConfigError('ERR_RATE_LIMIT_UNKNOWN_OPTION', `RateLimitModule: ${unknown}`);
}

function oneOf<T>(name: string, value: unknown, allowed: readonly T[], fallback: T): T {
  if (value === undefined) return fallback;
  if (!allowed.includes(value as T)) {
    const list = allowed.map((v) => (typeof v === 'string' ? `'${v}'` : String(v))).join(', ');
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_INVALID_OPTION',
      `RateLimitModule: ${name} must be one of ${list} (got ${JSON.stringify(value)})`,
    );
  }
  return value as T;
}

/** Applies defaults and rejects invalid module options with a message that says what to change. */
export function resolveOptions(options: RateLimitModuleOptions = {}): ResolvedRateLimitOptions {
  assertKnownKeys(options);
  const keyPrefix = options.keyPrefix ?? DEFAULT_KEY_PREFIX;
  if (typeof keyPrefix !== 'string' || /[{}\s]/.test(keyPrefix) || keyPrefix.length > 64) {
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_INVALID_OPTION',
      `RateLimitModule: keyPrefix must be at most 64 characters without braces or white space (got ${JSON.stringify(keyPrefix)})`,
    );
  }
  const timeoutMs = options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
  if (typeof timeoutMs !== 'number' || !Number.isFinite(timeoutMs) || timeoutMs <= 0) {
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_INVALID_OPTION',
      `RateLimitModule: timeoutMs must be a finite number > 0 (got ${typeof timeoutMs === 'string' ? JSON.stringify(timeoutMs) : String(timeoutMs)})`,
    );
  }
  if (timeoutMs > MAX_TIMEOUT_MS) {
    // Node clamps a longer timer to 1 ms (with a TimeoutOverflowWarning each time): every decision would time out at once.
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_INVALID_OPTION',
      `RateLimitModule: timeoutMs must be at most ${MAX_TIMEOUT_MS} (a Node timer's limit) (got ${timeoutMs})`,
    );
  }
  const apiKeyHeader = options.keys?.apiKeyHeader ?? DEFAULT_API_KEY_HEADER;
  if (typeof apiKeyHeader !== 'string' || !/^[A-Za-z0-9-]+$/.test(apiKeyHeader)) {
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_INVALID_OPTION',
      `RateLimitModule: keys.apiKeyHeader must be a header name (got ${JSON.stringify(apiKeyHeader)})`,
    );
  }
  if (options.keys?.user !== undefined && typeof options.keys.user !== 'function') {
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_INVALID_OPTION',
      'RateLimitModule: keys.user must be a function (request) => string | undefined',
    );
  }
  if (options.keys?.apiKey !== undefined && typeof options.keys.apiKey !== 'function') {
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_INVALID_OPTION',
      'RateLimitModule: keys.apiKey must be a function (request) => string | undefined (sync or async)',
    );
  }
  const secret = options.keys?.secret;
  if (secret !== undefined && (typeof secret !== 'string' || secret.length < 16)) {
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_INVALID_OPTION',
      'RateLimitModule: keys.secret must be a string of at least 16 characters',
    );
  }
  if (options.guard !== undefined && typeof options.guard !== 'boolean') {
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_INVALID_OPTION',
      `RateLimitModule: guard must be true or false (got ${JSON.stringify(options.guard)})`,
    );
  }
  const defaults = options.defaults === undefined ? [] : [options.defaults].flat();
  if (options.denyCache !== undefined && typeof options.denyCache !== 'boolean') {
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_INVALID_OPTION',
      `RateLimitModule: denyCache must be true or false (got ${JSON.stringify(options.denyCache)})`,
    );
  }
  if (options.coalesce !== undefined && typeof options.coalesce !== 'boolean') {
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_INVALID_OPTION',
      `RateLimitModule: coalesce must be true or false (got ${JSON.stringify(options.coalesce)})`,
    );
  }
  if (options.legacyHeaders !== undefined && typeof options.legacyHeaders !== 'boolean') {
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_INVALID_OPTION',
      `RateLimitModule: legacyHeaders must be true or false (got ${JSON.stringify(options.legacyHeaders)})`,
    );
  }
  if (options.enforce !== undefined && typeof options.enforce !== 'boolean') {
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_INVALID_OPTION',
      `RateLimitModule: enforce must be true or false (got ${JSON.stringify(options.enforce)})`,
    );
  }
  for (const hook of ['skipIf', 'onDecision'] as const) {
    if (options[hook] !== undefined && typeof options[hook] !== 'function') {
      throw new RateLimitConfigError(
        'ERR_RATE_LIMIT_INVALID_OPTION',
        `RateLimitModule: ${hook} must be a function (got ${JSON.stringify(options[hook])})`,
      );
    }
  }
  const resolverCacheMs = options.resolverCacheMs ?? DEFAULT_RESOLVER_CACHE_MS;
  if (typeof resolverCacheMs !== 'number' || !Number.isFinite(resolverCacheMs) || resolverCacheMs < 0 || resolverCacheMs > MAX_TIMEOUT_MS) {
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_INVALID_OPTION',
      `RateLimitModule: resolverCacheMs must be a number from 0 to ${MAX_TIMEOUT_MS} (got ${JSON.stringify(resolverCacheMs)})`,
    );
  }
  const maxLocalBuckets = options.maxLocalBuckets ?? DEFAULT_MAX_LOCAL_BUCKETS;
  if (!Number.isSafeInteger(maxLocalBuckets) || maxLocalBuckets < 1 || maxLocalBuckets > MAX_LOCAL_BUCKETS) {
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_INVALID_OPTION',
      `RateLimitModule: maxLocalBuckets must be an integer from 1 to ${MAX_LOCAL_BUCKETS} (got ${JSON.stringify(maxLocalBuckets)})`,
    );
  }
  const store = resolveStore(options);
  const acquire = options.acquire ?? {};
  if (typeof acquire !== 'object' || acquire === null) {
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_INVALID_OPTION',
      `RateLimitModule: acquire must be { maxWaitMs?, maxWaiting? } (got ${JSON.stringify(acquire)})`,
    );
  }
  const acquireMaxWaitMs = wholeNumber('acquire.maxWaitMs', acquire.maxWaitMs ?? DEFAULT_ACQUIRE_MAX_WAIT_MS, 0, MAX_TIMEOUT_MS);
  const acquireMaxWaiting = wholeNumber('acquire.maxWaiting', acquire.maxWaiting ?? DEFAULT_ACQUIRE_MAX_WAITING, 1, MAX_LOCAL_BUCKETS);
  return {
    redis: resolveRedis(options, store),
    store,
    keyPrefix,
    failureMode: oneOf('failureMode', options.failureMode, FAILURE_MODES, 'local'),
    timeoutMs,
    legacyHeaders: options.legacyHeaders ?? true,
    standardHeaders: oneOf('standardHeaders', options.standardHeaders, STANDARD_HEADERS, 'draft-6'),
    apiKeyHeader: apiKeyHeader.toLowerCase(),
    user: options.keys?.user,
    apiKey: options.keys?.apiKey,
    secret,
    defaults,
    denyCache: options.denyCache ?? true,
    coalesce: options.coalesce ?? true,
    guard: options.guard ?? true,
    enforce: options.enforce ?? true,
    lease: resolveLease(options.lease, 'the module options', 'RateLimitModule'),
    skipIf: options.skipIf,
    allowList: resolveAllowList(options.allowList),
    onDecision: options.onDecision,
    resolverCacheMs,
    maxLocalBuckets,
    metrics: resolveMetrics(options.metrics),
    startupCheck: oneOf('startupCheck', options.startupCheck, STARTUP_CHECKS, 'default'),
    acquireMaxWaitMs,
    acquireMaxWaiting,
    operations: resolveOperations(options.operations),
  };
}

/** An integer option from `min` to `max`, or a configuration error naming it. */
function wholeNumber(name: string, value: unknown, min: number, max: number): number {
  if (typeof value === 'number' && Number.isSafeInteger(value) && value >= min && value <= max) return value;
  throw new RateLimitConfigError(
    'ERR_RATE_LIMIT_INVALID_OPTION',
    `RateLimitModule: ${name} must be an integer from ${min} to ${max} (got ${JSON.stringify(value)})`,
  );
}

/** Checks `store`: 'redis', 'memory', or an object with a BucketStore's members (named when missing). */
function resolveStore(options: RateLimitModuleOptions): ResolvedRateLimitOptions['store'] {
  const store: unknown = options.store;
  if (!isStoreObject(store)) {
    if (store === undefined || (STORES as readonly unknown[]).includes(store)) return (store as 'redis' | 'memory' | undefined) ?? 'redis';
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_INVALID_OPTION',
      "RateLimitModule: store must be 'redis', 'memory' or a BucketStore (an object with take(), delete() and remote) " +
        `(got ${JSON.stringify(store)})`,
    );
  }
  const missing = missingStoreMembers(store);
  if (missing !== undefined)
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_INVALID_OPTION',
      `RateLimitModule: store must be 'redis', 'memory' or a BucketStore; the object given lacks ${missing}`,
    );
  // Refused rather than ignored, as an unknown key is: a URL written beside the store would suggest the
  // limiter talks to that Redis, while the store keeps its own connection.
  if (Object.hasOwn(options, 'redis')) {
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_INVALID_OPTION',
      'RateLimitModule: redis is not read with a BucketStore of your own (store: <object>): the store holds its own connection; remove redis',
    );
  }
  return store;
}

/**
 * Checks `redis`. `null` is a mistake like any other value (no `??`): only a missing option means the
 * default. `redis: undefined` written out is a URL from an environment variable that is not set: with the
 * Redis store it is refused rather than read as the default, localhost.
 */
function resolveRedis(options: RateLimitModuleOptions, store: ResolvedRateLimitOptions['store']): ResolvedRateLimitOptions['redis'] {
  if (options.redis !== undefined) return checkRedisOption(options.redis);
  if (Object.hasOwn(options, 'redis') && store === 'redis') throw undefinedRedisOption();
  return 'redis://127.0.0.1:6379';
}

/** Checks `metrics`: true, false, or `{ meterProvider }` with a `getMeter()` (an OpenTelemetry MeterProvider). */
function resolveMetrics(metrics: RateLimitModuleOptions['metrics']): ResolvedRateLimitOptions['metrics'] {
  if (metrics === undefined) return { mode: 'global', warn: false };
  if (metrics === true) return { mode: 'global', warn: true };
  if (metrics === false) return { mode: 'off' };
  const meterProvider =
    typeof metrics === 'object' && metrics !== null ? (metrics as { meterProvider?: unknown }).meterProvider : undefined;
  if (typeof (meterProvider as { getMeter?: unknown } | undefined)?.getMeter !== 'function') {
    const got =
      typeof metrics === 'object' && metrics !== null
        ? Object.keys(metrics).length === 0
          ? '{}'
          : `{ ${Object.keys(metrics).join(', ')} }`
        : typeof metrics === 'string'
          ? JSON.stringify(metrics)
          : String(metrics);
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_INVALID_OPTION',
      'RateLimitModule: metrics must be true, false or { meterProvider } with an OpenTelemetry MeterProvider ' +
        `(an object with getMeter(), e.g. new MeterProvider() of @opentelemetry/sdk-metrics) (got ${got})`,
    );
  }
  return { mode: 'provider', meterProvider: meterProvider as import('@opentelemetry/api').MeterProvider };
}

/** Checks `allowList`: every address or CIDR range must parse, so a typo fails the start instead of limiting a health checker. */
function resolveAllowList(allowList: RateLimitModuleOptions['allowList']): ResolvedRateLimitOptions['allowList'] {
  if (allowList === undefined) return { ips: [], users: new Set(), apiKeys: new Set() };
  if (typeof allowList !== 'object' || allowList === null) {
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_INVALID_OPTION',
      `RateLimitModule: allowList must be { ips?, users?, apiKeys? } (got ${JSON.stringify(allowList)})`,
    );
  }
  const list = (name: 'ips' | 'users' | 'apiKeys', value: unknown, ok: (item: unknown) => boolean): unknown[] => {
    if (value === undefined) return [];
    if (!Array.isArray(value))
      throw new RateLimitConfigError(
        'ERR_RATE_LIMIT_INVALID_OPTION',
        `RateLimitModule: allowList.${name} must be an array (got ${JSON.stringify(value)})`,
      );
    for (const item of value) {
      if (!ok(item))
        throw new RateLimitConfigError(
          'ERR_RATE_LIMIT_INVALID_OPTION',
          `RateLimitModule: allowList.${name} has an invalid entry ${JSON.stringify(item)}`,
        );
    }
    return value;
  };
  const ips = list('ips', allowList.ips, (item) => typeof item === 'string' && isAddressOrRange(item)) as string[];
  const users = list(
    'users',
    allowList.users,
    (item) => (typeof item === 'string' && item !== '') || (typeof item === 'number' && Number.isFinite(item)),
  );
  const apiKeys = list('apiKeys', allowList.apiKeys, (item) => typeof item === 'string' && item !== '');
  return { ips, users: new Set(users.map(String)), apiKeys: new Set(apiKeys as string[]) };
}

function isAddressOrRange(value: string): boolean {
  const [address, bits, extra] = value.split('/');
  const family = isIP(address);
  if (family === 0 || extra !== undefined) return false;
  if (bits === undefined) return true;
  if (!/^\d{1,3}$/.test(bits)) return false;
  return Number(bits) <= (family === 4 ? 32 : 128);
}
