import { Logger } from '@nestjs/common';
import { Cluster, type RedisOptions } from 'ioredis';
import { ThrottledLogger } from '../../throttled-logger.js';
import { maskUrl, type RedisClient } from './redis-options.validation.js';
import { RateLimitError } from '../../errors/rate-limit.errors.js';

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
  const pass = SENTINEL_PASS.exec(message);
  if (pass) {
    const last = pass[3] ? `; the last error: ${pass[3]}` : '';
    return pass[1] === undefined
      ? `no sentinel gave the master's address${last}`
      : `no sentinel gave the master's address in ioredis' last pass over them${last}; it asks them again in ${pass[1]} ms`;
  }
  return message || 'unknown error';
}

/**
 * ioredis' error at the end of a pass over the sentinels ("All sentinels are unreachable. Retrying
 * from scratch after 10ms. Last error: ..."): [1] the delay before the next pass (none: retry
 * disabled), [3] the last error, when one of them failed. It comes too when a reconnect starts where
 * the previous lookup left ioredis' list of sentinels, at its end: then no sentinel was asked at all.
 */
const SENTINEL_PASS =
  /^All sentinels are unreachable(?:\. Retrying from scratch after (\d+)ms| and retry is disabled)\.( Last error: (.*))?$/s;

/** One of ioredis' 'sentinelError' messages, in words: which sentinel, and what it did. */
export function describeSentinelError(message: string, master: string): string {
  const failed = /^failed to connect to sentinel (\S+) because (.*)$/s.exec(message);
  // ioredis asks for the master's replicas' sentinels after the address; for a name it does not know, that fails so.
  if (failed && /No such master with that name/i.test(failed[2])) return `sentinel ${failed[1]} knows no master named "${master}"`;
  // ioredis' connection to the sentinel could not be made (refused, ...) or closed: it keeps no more than that.
  if (failed && /^Connection is closed/.test(failed[2]))
    return `sentinel ${failed[1]}: no connection (refused, or closed before it answered)`;
  if (failed) {
    // Only the text of the error is left: its code (ECONNREFUSED...) is read back from it.
    const code = /\b(E[A-Z_]{3,})\b/.exec(failed[2])?.[1];
    return `sentinel ${failed[1]}: ${describeCause(Object.assign(new Error(failed[2]), { code }))}`;
  }
  const invalid = /^connected to sentinel (\S+) successfully, but got an invalid reply: (.*)$/s.exec(message);
  if (invalid) {
    return invalid[2] === 'null'
      ? `sentinel ${invalid[1]} knows no master named "${master}"`
      : `sentinel ${invalid[1]} answered ${invalid[2]}`;
  }
  return message;
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
  private last: unknown;
  /** What the client does after a connection error, for the warning (`OwnedConnection`). */
  retrying = 'the client keeps retrying';
  /** While the start-up check runs, it reports connection errors itself. */
  private muted = false;
  /** What each sentinel ioredis asked for the master did wrong, since its pass over them began (its 'sentinelError' events). */
  private sentinelErrors: string[] = [];

  constructor(private readonly client: RedisClient) {
    this.target = describeTarget(client);
    this.tls = Boolean((client.options as ClientOptions | undefined)?.tls);
    this.secrets = secretsOf(client);
  }

  /** Listens to the client's 'error' and 'ready' events; the listener also keeps ioredis from printing them. */
  attach(): this {
    this.client.on('error', (error: unknown) => this.failed(error));
    this.client.on('ready', () => this.ready());
    this.client.on('connecting', () => (this.sentinelErrors = []));
    this.client.on('sentinelError', (error: unknown) =>
      this.sentinelErrors.push(describeSentinelError(isErrorLike(error) ? error.message : String(error), this.masterName())),
    );
    return this;
  }

  /** The client's last connection error, as it came; undefined once connected. */
  get lastError(): unknown {
    return this.last;
  }

  /** Runs `check` with connection errors recorded but not logged; the next warning waits a full interval if one came. */
  async quietly<T>(check: () => Promise<T>): Promise<T> {
    this.muted = true;
    try {
      return await check();
    } finally {
      this.muted = false;
      if (this.last !== undefined) this.logger.hold('warn');
    }
  }

  /** The client's last connection error, in words. */
  cause(): string | undefined {
    return this.last === undefined ? undefined : this.scrub(describeCause(this.last, this.tls));
  }

  /** The error a decision gets while the client is not connected: where, and why. */
  notConnected(): Error {
    const cause = this.cause();
    return new RateLimitError(
      'ERR_RATE_LIMIT_REDIS_NOT_CONNECTED',
      `${this.target} is not connected: ${cause ?? `connection ${this.client.status}`}`,
    );
  }

  /**
   * Start-up gave up waiting for the connection. Logged once, outside the throttle: when the cause is
   * already known it was just logged, and when it is not (a connect timeout takes 10 s), the error that
   * comes later must not be held back by this line.
   */
  notReadyAtStart(): void {
    if (this.last !== undefined) return;
    new Logger('RateLimit').warn(`${this.target} is not reachable yet; decisions follow failureMode until it answers`);
  }

  /** A reply said READONLY: the server was demoted. */
  readOnly(error: unknown): void {
    this.warn(
      `${this.target} answered READONLY (${firstSentence(isErrorLike(error) ? error.message : String(error))}): ` +
        'it is a replica now, e.g. after a failover; reconnecting; the refused command is not sent again',
    );
  }

  private failed(error: unknown): void {
    const pass = isErrorLike(error) ? SENTINEL_PASS.exec(error.message) : null;
    if (pass) {
      const asked = this.sentinelErrors;
      this.sentinelErrors = [];
      // The pass began at the end of ioredis' list (where the last lookup left it) and asked no sentinel: not a failure.
      if (asked.length === 0) return;
      this.last = error;
      if (this.muted) return;
      const next = pass[1] === undefined ? 'ioredis does not ask them again' : `ioredis asks them again in ${pass[1]} ms`;
      return this.warn(
        `Cannot connect to ${this.target}: no sentinel gave the master's address (${asked.join('; ')}); ` +
          `decisions follow failureMode until one does and the master answers; ${next}`,
      );
    }
    this.last = error;
    if (this.muted) return;
    this.warn(
      `Cannot connect to ${this.target}: ${describeCause(error, this.tls)}; ` +
        `decisions follow failureMode until it answers, and ${this.retrying}`,
    );
  }

  private masterName(): string {
    return String((this.client.options as ClientOptions | undefined)?.name ?? '');
  }

  /** Connected: the recovery itself is logged by BucketService, with the decisions the outage cost. */
  private ready(): void {
    this.last = undefined;
  }

  private warn(message: string): void {
    this.logger.warn(this.scrub(message));
  }

  /** `text` with every password of the client replaced by `***`. */
  scrub(text: string): string {
    let scrubbed = text;
    for (const secret of this.secrets) scrubbed = scrubbed.split(secret).join('***');
    return scrubbed;
  }
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
