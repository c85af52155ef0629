import { Logger } from '@nestjs/common';
import { Cluster, Redis, type RedisOptions } from 'ioredis';
import { ThrottledLogger } from '../throttled-logger.js';

export type RedisClient = Redis | Cluster;
/** What the `redis` option accepts. */
export type RedisOption = string | RedisOptions | RedisClient;

const ACCEPTED = 'a redis:// or rediss:// URL string, ioredis RedisOptions or a Redis / Cluster client';

/**
 * Every key of ioredis 6's `RedisOptions`: `CommonRedisOptions` and `CommanderOptions`
 * (built/redis/RedisOptions.d.ts, built/utils/Commander.d.ts), `SentinelConnectionOptions`
 * (built/connectors/SentinelConnector/index.d.ts) and `StandaloneConnectionOptions`
 * (built/connectors/StandaloneConnector.d.ts: net's port, host, family, path, plus tls and
 * disconnectTimeout). redis-connection.spec.ts reads those files and fails when this list and they differ.
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

/** Keys people write that ioredis does not read, with what to write instead. */
const MISTAKEN_KEYS: Record<string, string> = { hostname: 'host', pass: 'password', user: 'username', database: 'db' };

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

/** Edit distance of two short words (option names), a swap of two neighbours counting as one edit. */
function distance(a: string, b: string): number {
  const d = Array.from({ length: a.length + 1 }, (_, i) => Array.from({ length: b.length + 1 }, (_, j) => (i === 0 ? j : j === 0 ? i : 0)));
  for (let i = 1; i <= a.length; i++) {
    for (let j = 1; j <= b.length; j++) {
      const substitution = a[i - 1] === b[j - 1] ? 0 : 1;
      d[i][j] = Math.min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + substitution);
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1]) d[i][j] = Math.min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.length][b.length];
}

/** The RedisOptions key `key` was probably meant to be, if one is close enough. */
function closeKey(key: string): string | undefined {
  if (MISTAKEN_KEYS[key]) return MISTAKEN_KEYS[key];
  let best: string | undefined;
  let bestDistance = Infinity;
  for (const known of REDIS_OPTION_KEYS) {
    const d = known.toLowerCase() === key.toLowerCase() ? 0 : distance(key, known);
    if (d < bestDistance) [best, bestDistance] = [known, d];
  }
  return bestDistance <= Math.max(1, Math.floor(key.length / 3)) ? best : undefined;
}

function reject(detail: string): never {
  throw new Error(`RateLimitModule: ${detail}; redis must be ${ACCEPTED}`);
}

/**
 * Checks the `redis` option and answers it as it is, or throws a start-up error that names the accepted
 * forms. A plain object may hold only keys ioredis reads: anything else (a typo, `{ url }`) would be
 * ignored by ioredis and connect to localhost:6379.
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
    throw new Error(`RateLimitModule: redis must be a redis:// or rediss:// URL (got ${shown(value)})`);
  } else if (isPlainObject(value)) {
    for (const key of Object.keys(value)) {
      if (key === 'url') {
        const url = typeof value.url === 'string' ? ` (redis: ${JSON.stringify(maskUrl(value.url))})` : '';
        reject(`redis.url is not an ioredis option: pass the URL string itself${url}`);
      }
      if (!REDIS_OPTION_KEYS.has(key)) {
        const close = closeKey(key);
        reject(`redis.${key} is not an ioredis RedisOptions key${close ? ` (did you mean "${close}"?)` : ''}`);
      }
    }
    const { host, port } = value;
    if (host !== undefined && (typeof host !== 'string' || host === '')) {
      reject(`redis.host must be a host name or address (got ${shown(host)})`);
    }
    const portNumber = typeof port === 'string' && /^\d+$/.test(port) ? Number(port) : port;
    if (port !== undefined && !(Number.isInteger(portNumber) && (portNumber as number) >= 0 && (portNumber as number) <= 65535)) {
      reject(`redis.port must be a port number 0..65535 (got ${shown(port)})`);
    }
    return value as RedisOptions;
  }
  throw new Error(`RateLimitModule: redis must be ${ACCEPTED} (got ${shown(value)})`);
}

type ClientOptions = Partial<RedisOptions> & { tls?: unknown };

/** Where a client connects, for log lines: `Redis at host:port`, a socket path, or the sentinels it asks. */
export function describeTarget(client: RedisClient): string {
  if (client instanceof Cluster) {
    const nodes = (client as unknown as { startupNodes?: unknown[] }).startupNodes ?? [];
    const shownNodes = nodes.map((node) =>
      typeof node === 'object' && node !== null
        ? `${(node as { host?: string }).host ?? 'localhost'}:${(node as { port?: number }).port ?? 6379}`
        : maskUrl(String(node)),
    );
    return `Redis Cluster (${shownNodes.join(', ') || 'no startup nodes'})`;
  }
  const options = (client.options ?? {}) as ClientOptions;
  const tls = options.tls ? ' (TLS)' : '';
  if (options.sentinels && options.sentinels.length > 0) {
    const sentinels = options.sentinels.map((s) => `${s.host ?? 'localhost'}:${s.port ?? 26379}`).join(', ');
    return `Redis master "${options.name ?? ''}" via sentinels ${sentinels}${tls}`;
  }
  if (options.path) return `Redis at ${options.path}${tls}`;
  return `Redis at ${options.host ?? 'localhost'}:${options.port ?? 6379}${tls}`;
}

/** The password-like options of a client, so that no log line can carry one by accident. */
function secretsOf(client: RedisClient): string[] {
  const options = (client.options ?? {}) as ClientOptions;
  const redisOptions = (client instanceof Cluster ? (client.options as { redisOptions?: ClientOptions }).redisOptions : options) ?? {};
  return [redisOptions.password, redisOptions.sentinelPassword].filter(
    (secret): secret is string => typeof secret === 'string' && secret.length > 0,
  );
}

const TLS_CODES = /^(ERR_SSL_|ERR_TLS_|EPROTO$|CERT_|DEPTH_ZERO_SELF_SIGNED_CERT$|SELF_SIGNED_CERT_IN_CHAIN$|UNABLE_TO_)/;

/** What went wrong, in words, followed by the error's own text in parentheses. */
export function describeCause(error: unknown, tls = false): string {
  // Not `instanceof Error`: errors from another realm (a VM context, a second copy of a library) count too.
  const err = isErrorLike(error) ? (error as Error & { code?: string; reason?: string }) : undefined;
  const message = err ? err.message.trim() : String(error);
  const code = typeof err?.code === 'string' ? err.code : '';
  const own = (text: string, detail = message) => (detail ? `${text} (${detail})` : text);
  if (code === 'ECONNREFUSED') return own('connection refused');
  if (code === 'ENOTFOUND' || code === 'EAI_AGAIN' || code === 'EAI_NONAME') return own('host not found');
  if (/^WRONGPASS|invalid password|invalid username-password/i.test(message)) {
    return own('authentication failed: wrong username or password');
  }
  if (/^NOAUTH/.test(message)) {
    return own('authentication required: the server asks for a password and none was given', firstSentence(message));
  }
  if (TLS_CODES.test(code) || /\b(SSL|TLS)\b|certificate/i.test(message)) {
    const reason = err?.reason ?? message.split('\n')[0];
    const hint = /WRONG_VERSION|wrong version number|packet length too long/i.test(`${code} ${message}`)
      ? ': does the server speak TLS on this port?'
      : /CERT|certificate/i.test(`${code} ${message}`)
        ? ': is the server certificate trusted (tls.ca) and issued for this host name?'
        : '';
    return `TLS handshake failed: ${reason}${code ? ` (${code})` : ''}${hint}`;
  }
  if (code === 'ETIMEDOUT' || /timed? ?out/i.test(message)) {
    return own(tls ? 'connection timed out (with TLS on, also check that the server speaks TLS on this port)' : 'connection timed out');
  }
  if (code === 'ECONNRESET' || code === 'EPIPE') return own('the connection was closed by the other side');
  if (/^READONLY/.test(message)) return own('the server is a read-only replica (READONLY)', firstSentence(message));
  return message || 'unknown error';
}

function firstSentence(message: string): string {
  const end = message.search(/[.,](\s|$)/);
  return end > 0 ? message.slice(0, end) : message;
}

function isErrorLike(value: unknown): value is Error {
  return typeof value === 'object' && value !== null && typeof (value as Error).message === 'string';
}

export function isReadOnlyError(error: unknown): boolean {
  return isErrorLike(error) && error.message.startsWith('READONLY');
}

/**
 * Watches a client the module created: logs why it cannot connect (at most once per 10 s, never a
 * password), and describes the last cause when a decision fails because the client is not connected.
 */
export class RedisDiagnostics {
  readonly target: string;
  private readonly tls: boolean;
  private readonly secrets: string[];
  private readonly logger = new ThrottledLogger('RateLimit');
  private lastError: unknown;

  constructor(private readonly client: RedisClient) {
    this.target = describeTarget(client);
    this.tls = Boolean((client.options as ClientOptions | undefined)?.tls);
    this.secrets = secretsOf(client);
  }

  /** Listens to the client's 'error' and 'ready' events; the listener also keeps ioredis from printing them. */
  attach(): this {
    this.client.on('error', (error: unknown) => this.failed(error));
    this.client.on('ready', () => this.ready());
    return this;
  }

  /** The client's last connection error, in words. */
  cause(): string | undefined {
    return this.lastError === undefined ? undefined : this.scrub(describeCause(this.lastError, this.tls));
  }

  /** The error a decision gets while the client is not connected: where, and why. */
  notConnected(): Error {
    const cause = this.cause();
    return new Error(`${this.target} is not connected: ${cause ?? `connection ${this.client.status}`}`);
  }

  /**
   * Start-up gave up waiting for the connection. Logged once, outside the throttle: when the cause is
   * already known it was just logged, and when it is not (a connect timeout takes 10 s), the error that
   * comes later must not be held back by this line.
   */
  notReadyAtStart(): void {
    if (this.lastError !== undefined) return;
    new Logger('RateLimit').warn(
      `${this.target} is not reachable yet; decisions follow failureMode until it answers`,
    );
  }

  /** A reply said READONLY: the server was demoted. */
  readOnly(error: unknown): void {
    this.warn(
      `${this.target} answered READONLY (${firstSentence(isErrorLike(error) ? error.message : String(error))}): ` +
        'it is a replica now, e.g. after a failover; reconnecting; the refused command is not sent again',
    );
  }

  private failed(error: unknown): void {
    this.lastError = error;
    this.warn(
      `Cannot connect to ${this.target}: ${describeCause(error, this.tls)}; ` +
        'decisions follow failureMode until it answers, and the client keeps retrying',
    );
  }

  /** Connected: the recovery itself is logged by BucketService, with the decisions the outage cost. */
  private ready(): void {
    this.lastError = undefined;
  }

  private warn(message: string): void {
    this.logger.warn(this.scrub(message));
  }

  private scrub(text: string): string {
    let scrubbed = text;
    for (const secret of this.secrets) scrubbed = scrubbed.split(secret).join('***');
    return scrubbed;
  }
}

/**
 * ioredis' `reconnectOnError`: a READONLY reply means the server the client talks to was demoted to a
 * replica (a failover). Answer 1: drop the connection and reconnect, so that the address (a DNS name, a
 * proxy, the sentinels) can lead to the new master. Never 2 (reconnect and resend the failed command):
 * that decision was already answered by `failureMode`, and resending it later would take tokens for a
 * request long gone. Other errors are left to the application's own `reconnectOnError`, whose "resend"
 * is downgraded to "reconnect" for the same reason.
 */
export function reconnectOnReadOnly(
  diagnostics: () => RedisDiagnostics | undefined,
  own?: RedisOptions['reconnectOnError'],
): (error: Error) => boolean | 1 | 2 {
  return (error) => {
    if (isReadOnlyError(error)) {
      diagnostics()?.readOnly(error);
      return 1;
    }
    const answer = own ? own(error) : false;
    return answer === 2 ? 1 : answer;
  };
}

const DIAGNOSTICS = new WeakMap<RedisClient, RedisDiagnostics>();

/** The diagnostics of a client the module created, attached once. */
export function diagnosticsOf(client: RedisClient): RedisDiagnostics {
  let diagnostics = DIAGNOSTICS.get(client);
  if (!diagnostics) {
    diagnostics = new RedisDiagnostics(client).attach();
    DIAGNOSTICS.set(client, diagnostics);
  }
  return diagnostics;
}

/**
 * Checks the `redis` option, then builds the client for a URL or options, or takes the caller's client
 * as it is (no listener, no option changed: the application owns it).
 */
export function createRedisClient(redis: unknown): { client: RedisClient; owned: boolean } {
  const option = checkRedisOption(redis);
  if (isRedisClient(option)) return { client: option, owned: false };
  let client: Redis | undefined;
  const own = typeof option === 'string' ? undefined : option.reconnectOnError;
  // A dead Redis must fail a decision at once, not queue it and replay it minutes later: no offline
  // queue, and commands in flight when the connection drops are failed, not resent after a reconnect.
  const failFast: RedisOptions = {
    enableOfflineQueue: false,
    maxRetriesPerRequest: 0,
    autoResendUnfulfilledCommands: false,
    disconnectTimeout: 100,
    reconnectOnError: reconnectOnReadOnly(() => (client ? diagnosticsOf(client) : undefined), own),
    // The socket opens in onModuleInit: an application that fails to compile leaves no connection behind.
    lazyConnect: true,
  };
  client = typeof option === 'string' ? new Redis(option, failFast) : new Redis({ ...option, ...failFast });
  diagnosticsOf(client);
  return { client, owned: true };
}
