import { Cluster, Redis, type RedisOptions } from 'ioredis';
import { nearestKey, unknownKeyOf } from '../../unknown-keys.js';
import type { RateLimitErrorCode } from '../../errors/error-codes.js';
import { RateLimitConfigError } from '../../errors/rate-limit.errors.js';

export type RedisClient = Redis | Cluster;
/** What the `redis` option accepts. */
export type RedisOption = string | RedisOptions | RedisClient;

const ACCEPTED = 'a redis:// or rediss:// URL string, ioredis RedisOptions or a Redis / Cluster client';

/**
 * Every key of `RedisOptions` in the ioredis versions we support (5.8 to 6): `CommonRedisOptions` and
 * `CommanderOptions` (built/redis/RedisOptions.d.ts, built/utils/Commander.d.ts),
 * `SentinelConnectionOptions` (built/connectors/SentinelConnector/index.d.ts) and
 * `StandaloneConnectionOptions` (built/connectors/StandaloneConnector.d.ts: net's port, host, family,
 * path, plus tls and disconnectTimeout). Keys that only later versions read are in `LATER_KEYS`.
 * test/redis/connection/redis-options-validation.e2e-spec.ts reads the installed ioredis' files and its `Redis.defaultOptions`
 * and fails when this list and they differ.
 */
export const REDIS_OPTION_KEYS: ReadonlySet<string> = new Set([
  // CommanderOptions
  'keyPrefix',
  'showFriendlyErrorStack',
  // CommonRedisOptions
  'Connector',
  'retryStrategy',
  'commandTimeout',
  'blockingTimeout',
  'blockingTimeoutGrace',
  'socketTimeout',
  'keepAlive',
  'noDelay',
  'connectionName',
  'disableClientInfo',
  'clientInfoTag',
  'username',
  'password',
  'db',
  'autoResubscribe',
  'autoResendUnfulfilledCommands',
  'reconnectOnError',
  'readOnly',
  'stringNumbers',
  'protocol',
  'replyMapping',
  'connectTimeout',
  'monitor',
  'maxRetriesPerRequest',
  'maxLoadingRetryTime',
  'enableAutoPipelining',
  'autoPipeliningIgnoredCommands',
  'offlineQueue',
  'commandQueue',
  'enableOfflineQueue',
  'enableReadyCheck',
  'lazyConnect',
  'scripts',
  'himportFieldsets',
  // SentinelConnectionOptions
  'sentinels',
  'name',
  'role',
  'tls',
  'sentinelUsername',
  'sentinelPassword',
  'path',
  'family',
  'sentinelRetryStrategy',
  'sentinelReconnectStrategy',
  'preferredSlaves',
  'disconnectTimeout',
  'sentinelCommandTimeout',
  'enableTLSForSentinelMode',
  'sentinelTLS',
  'natMap',
  'updateSentinels',
  'sentinelMaxConnections',
  'failoverDetector',
  // StandaloneConnectionOptions
  'port',
  'host',
]);

/**
 * Keys ioredis 5.8 does not read, each with a key of `Redis.defaultOptions` that shows the installed
 * ioredis does (compared in the ioredis sources at v5.8.0, v5.11.1 and v6.0.0): with an older ioredis
 * such a key would be ignored as silently as a typo.
 */
export const LATER_KEYS: Readonly<Record<string, { since: string; marker: string }>> = {
  blockingTimeout: { since: '5.9', marker: 'blockingTimeoutGrace' },
  blockingTimeoutGrace: { since: '5.9', marker: 'blockingTimeoutGrace' },
  protocol: { since: '6', marker: 'protocol' },
  replyMapping: { since: '6', marker: 'protocol' },
  himportFieldsets: { since: '6', marker: 'protocol' },
};

/** Keys people write that ioredis does not read, with what to write instead. */
const MISTAKEN_KEYS: Record<string, string> = { hostname: 'host', pass: 'password', user: 'username', database: 'db' };

/** What a sentinel entry holds (ioredis' `SentinelAddress`). */
const SENTINEL_KEYS = ['host', 'port', 'family'];

/** What leaving each key out means, for the message that refuses it as undefined. */
const WHEN_LEFT_OUT: Record<string, string> = { host: 'connect to localhost', port: 'use 6379', path: 'connect over TCP' };
const MISSING = '(is an environment variable missing?)';

/** The keys the installed ioredis reads, given its `Redis.defaultOptions`. */
export function redisOptionKeysFor(defaults: object): Set<string> {
  return new Set([...REDIS_OPTION_KEYS].filter((key) => !LATER_KEYS[key] || LATER_KEYS[key].marker in defaults));
}

/** ioredis' defaults (a static of `Redis`, private in its types); without it, every supported key is taken. */
const IOREDIS_DEFAULTS = (Redis as unknown as { defaultOptions?: object }).defaultOptions;
const INSTALLED_KEYS =
  typeof IOREDIS_DEFAULTS === 'object' && IOREDIS_DEFAULTS !== null ? redisOptionKeysFor(IOREDIS_DEFAULTS) : REDIS_OPTION_KEYS;

export function isRedisClient(value: unknown): value is RedisClient {
  return value instanceof Redis || value instanceof Cluster || looksLikeClient(value);
}

/** A client from another copy of ioredis (a second node_modules) is not an instance of ours. */
function looksLikeClient(value: unknown): boolean {
  return (
    typeof value === 'object' &&
    value !== null &&
    typeof (value as RedisClient).defineCommand === 'function' &&
    typeof (value as RedisClient).status === 'string'
  );
}

/**
 * `url` with its password replaced by `***`, in the user-info part (`user:pass@`) and in query
 * parameters ioredis would read as one (`?password=`, `?sentinelPassword=`). Works on text that is
 * not a valid URL too, since that is where it is needed: in the message that rejects it.
 */
export function maskUrl(url: string): string {
  return url
    .replace(/^([^/?#@]*\/\/)?([^/?#@:]*):([^/?#@]*)@/, (_, scheme = '', user) => `${scheme}${user}:***@`)
    .replace(/([?&][^=&#]*pass[^=&#]*=)[^&#]*/gi, '$1***');
}

/** What a rejected value was, for the message: strings quoted (passwords masked), objects by kind. */
function shown(value: unknown): string {
  if (typeof value === 'string') return JSON.stringify(maskUrl(value));
  if (value === null || typeof value !== 'object') return typeof value === 'function' ? 'a function' : String(value);
  if (Array.isArray(value)) return 'an array';
  const name = (value as object).constructor?.name;
  return name && name !== 'Object' ? `a ${name}` : 'an object';
}

function isPlainObject(value: unknown): value is Record<string, unknown> {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) return false;
  const proto = Object.getPrototypeOf(value);
  return proto === Object.prototype || proto === null;
}

/** A key the installed ioredis does not read is `ERR_RATE_LIMIT_UNKNOWN_OPTION`, as in the module's own options; a wrong value `..._INVALID_REDIS_OPTION`. */
function reject(detail: string, code: RateLimitErrorCode = 'ERR_RATE_LIMIT_INVALID_REDIS_OPTION'): never {
  throw new RateLimitConfigError(code, `RateLimitModule: ${detail}; redis must be ${ACCEPTED}`);
}

/**
 * A port: a number 1..65535, or a string of its digits as an environment variable (and a URL) gives it,
 * answered as the number. The same rule for the port of the options and of every sentinel; ioredis
 * itself would `parseInt` a string and so read `'6380x'` as 6380 and `' '` as NaN.
 */
function checkPort(port: unknown, where: string): number | undefined {
  if (port === undefined) return undefined;
  const number = typeof port === 'string' && /^[0-9]{1,5}$/.test(port) ? Number(port) : port;
  if (!(typeof number === 'number' && Number.isInteger(number) && number >= 1 && number <= 65535)) {
    reject(`${where} must be a port number 1..65535, or a string of its digits (got ${shown(port)})`);
  }
  return number as number;
}

function checkKey(key: string): void {
  if (INSTALLED_KEYS.has(key)) return;
  if (LATER_KEYS[key]) {
    reject(
      `redis.${key} is read by ioredis ${LATER_KEYS[key].since} and later only: the installed ioredis would ignore it; upgrade ioredis or remove it`,
      'ERR_RATE_LIMIT_UNKNOWN_OPTION',
    );
  }
  const close = nearestKey(key, INSTALLED_KEYS, MISTAKEN_KEYS);
  reject(`redis.${key} is not an ioredis RedisOptions key${close ? ` (did you mean "${close}"?)` : ''}`, 'ERR_RATE_LIMIT_UNKNOWN_OPTION');
}

function checkSentinels(sentinels: unknown): unknown {
  if (!Array.isArray(sentinels)) return sentinels;
  const checked = sentinels.map((sentinel: unknown, i) => {
    if (!isPlainObject(sentinel)) return sentinel;
    const where = `redis.sentinels[${i}]`;
    const unknown = unknownKeyOf(sentinel, SENTINEL_KEYS, where);
    if (unknown !== undefined) reject(unknown, 'ERR_RATE_LIMIT_UNKNOWN_OPTION');
    if ('host' in sentinel && sentinel.host === undefined) {
      throw new RateLimitConfigError(
        'ERR_RATE_LIMIT_REDIS_OPTION_UNDEFINED',
        `RateLimitModule: ${where}.host is undefined ${MISSING}: give the sentinel's host name or address`,
      );
    }
    const port = checkPort(sentinel.port, `${where}.port`);
    return port === sentinel.port ? sentinel : { ...sentinel, port };
  });
  // The same array when nothing changed: the options are then answered as they came.
  return checked.every((sentinel, i) => sentinel === sentinels[i]) ? sentinels : checked;
}

/**
 * Checks the `redis` option and answers it, or throws a start-up error that names the accepted forms.
 * A plain object may hold only keys the installed ioredis reads: anything else (a typo, `{ url }`)
 * would be ignored by ioredis and connect to localhost:6379. So would a host, port or path that is
 * present but undefined (an environment variable that is not set): refused too. Ports given as strings
 * of digits are answered as numbers (a copy of the options; the caller's object is left as it is).
 */
export function checkRedisOption(value: unknown): RedisOption {
  if (isRedisClient(value)) return value;
  if (typeof value === 'string') {
    let protocol: string | undefined;
    try {
      protocol = new URL(value).protocol;
    } catch {
      protocol = undefined;
    }
    if (protocol === 'redis:' || protocol === 'rediss:') return value;
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_INVALID_REDIS_OPTION',
      `RateLimitModule: redis must be a redis:// or rediss:// URL (got ${shown(value)})`,
    );
  } else if (isPlainObject(value)) {
    for (const key of Object.keys(value)) {
      if (key === 'url') {
        const url = typeof value.url === 'string' ? ` (redis: ${JSON.stringify(maskUrl(value.url))})` : '';
        reject(`redis.url is not an ioredis option: pass the URL string itself${url}`, 'ERR_RATE_LIMIT_UNKNOWN_OPTION');
      }
      checkKey(key);
      if (value[key] === undefined && WHEN_LEFT_OUT[key]) {
        throw new RateLimitConfigError(
          'ERR_RATE_LIMIT_REDIS_OPTION_UNDEFINED',
          `RateLimitModule: redis.${key} is undefined ${MISSING}: give it a value, or leave ${key} out to ${WHEN_LEFT_OUT[key]}`,
        );
      }
    }
    const { host } = value;
    if (host !== undefined && (typeof host !== 'string' || host === '')) {
      reject(`redis.host must be a host name or address (got ${shown(host)})`);
    }
    const port = checkPort(value.port, 'redis.port');
    const sentinels = checkSentinels(value.sentinels);
    if (port === value.port && sentinels === value.sentinels) return value as RedisOptions;
    // Only the keys given: a `port: undefined` added here would be refused when the copy is checked again.
    const copy: Record<string, unknown> = { ...value, sentinels };
    if (port !== undefined) copy.port = port;
    if (sentinels === undefined) delete copy.sentinels;
    return copy as RedisOptions;
  }
  throw new RateLimitConfigError('ERR_RATE_LIMIT_INVALID_REDIS_OPTION', `RateLimitModule: redis must be ${ACCEPTED} (got ${shown(value)})`);
}

/** `redis: undefined` given explicitly: a URL from an environment variable that is not set. */
export function undefinedRedisOption(): RateLimitConfigError {
  return new RateLimitConfigError(
    'ERR_RATE_LIMIT_REDIS_OPTION_UNDEFINED',
    `RateLimitModule: redis is undefined ${MISSING}: give a redis:// URL, RedisOptions or a client, ` +
      'or leave redis out to connect to redis://127.0.0.1:6379',
  );
}
