import { Logger } from '@nestjs/common';
import type { RedisOptions } from 'ioredis';
import { CONNECT_WAIT_MS } from '../../rate-limit.constants.js';
import type { FailureMode, StartupCheck } from '../../rate-limit.options.js';
import type { RedisClient } from './redis-options.validation.js';
import { describeCause, type RedisDiagnostics } from './redis-diagnostics.js';
import type { RateLimitErrorCode } from '../../errors/error-codes.js';
import { RateLimitConfigError } from '../../errors/rate-limit.errors.js';

/** What the start-up check of a client the module created needs to know. */
export interface StartupCheckSettings {
  mode: StartupCheck;
  keyPrefix: string;
  failureMode: FailureMode;
}

type ScriptCommand = (...args: (string | number)[]) => Promise<unknown>;

const TLS_FAILURE = /^(ERR_SSL_|ERR_TLS_|CERT_|DEPTH_ZERO_SELF_SIGNED_CERT$|SELF_SIGNED_CERT_IN_CHAIN$|UNABLE_TO_)/;
const DNS_FAILURE = /^(ENOTFOUND|EAI_AGAIN|EAI_NONAME|EAI_FAIL)$/;

type Verdict = 'credentials' | 'tls' | 'dns' | undefined;

/** Whether a connection error is a misconfiguration (fatal at start-up) or may be an outage. */
function classify(error: unknown): Verdict {
  const { message = '', code = '' } = (error ?? {}) as { message?: string; code?: string };
  if (/^(WRONGPASS|NOAUTH)|invalid password|invalid username-password/i.test(message)) return 'credentials';
  if (typeof code === 'string' && TLS_FAILURE.test(code)) return 'tls';
  if (typeof code === 'string' && DNS_FAILURE.test(code)) return 'dns';
  return undefined;
}

/** A refusal of the ACL: NOPERM (a key or a command), or Redis 7.0's text for a command refused inside a script. */
function isPermissionError(error: unknown): boolean {
  const message = error instanceof Error ? error.message : String(error);
  return /^NOPERM|can't run this command or subcommand/.test(message);
}

/** Settles with the first of: ready, a connection error `fatal` picks, or `ms` without either. */
function firstOutcome(client: RedisClient, ms: number, fatal: (error: unknown) => boolean): Promise<'ready' | 'late' | { error: unknown }> {
  return new Promise((resolve) => {
    const done = (outcome: 'ready' | 'late' | { error: unknown }) => {
      clearTimeout(timer);
      client.off('ready', onReady);
      client.off('error', onError);
      resolve(outcome);
    };
    const onReady = () => done('ready');
    const onError = (error: unknown) => {
      if (fatal(error)) done({ error });
    };
    const timer = setTimeout(() => done('late'), ms);
    client.on('ready', onReady);
    client.on('error', onError);
  });
}

/**
 * Runs once in `onModuleInit` for a client the module created: connects, then takes a token from a probe
 * key under the prefix (capacity 1, refilled in 1 ms, deleted after) with the limiter's own script and
 * DEL, so that an ACL that refuses any of its commands or keys is seen now rather than on every
 * request. Misconfiguration (credentials, TLS verification, the ACL; with 'strict' a host that does
 * not resolve) drops the connection and throws; an outage (refused, no answer, a host not found yet)
 * is logged at error level and the app starts under failureMode. Nothing is added per request.
 */
export async function checkAtStartup(
  client: RedisClient,
  diagnostics: RedisDiagnostics,
  script: ScriptCommand,
  settings: StartupCheckSettings,
): Promise<void> {
  const fatal = (error: unknown) => {
    const verdict = classify(error);
    return verdict === 'credentials' || verdict === 'tls' || (verdict === 'dns' && settings.mode === 'strict');
  };
  const outcome = await diagnostics.quietly(() => firstOutcome(client, CONNECT_WAIT_MS, fatal));
  if (outcome !== 'ready') {
    if (outcome !== 'late') fail(client, diagnostics, outcome.error);
    const cause = diagnostics.cause() ?? `no answer within ${CONNECT_WAIT_MS} ms`;
    const dnsHint = classify(diagnostics.lastError) === 'dns' ? " (startupCheck: 'strict' makes this fatal)" : '';
    new Logger('RateLimit').error(
      `${diagnostics.target} is not reachable at start-up: ${cause}; starting anyway: decisions follow failureMode ` +
        `'${settings.failureMode}' until it answers${dnsHint}`,
    );
    return;
  }
  const tooOld = await serverTooOld(client);
  if (tooOld !== undefined) {
    client.disconnect();
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_REDIS_VERSION',
      `RateLimitModule cannot start: ${diagnostics.target} runs Redis ${tooOld}; the rate limiter's script needs Redis ` +
        `${MIN_REDIS_VERSION.join('.')} or later (PEXPIRE ... GT): upgrade Redis, or set startupCheck: false to start without this check`,
    );
  }
  const key = `${settings.keyPrefix}{rate-limit-startup-check}:probe`;
  try {
    // take (header 8), capacity 1, refill 1000/s, cost 1: the key expires in 2 ms if DEL is refused.
    await script(1, key, 8, 1, 1000, 1);
    await client.del(key);
  } catch (error) {
    if (isPermissionError(error) || classify(error) === 'credentials') denied(client, diagnostics, error, settings.keyPrefix);
    new Logger('RateLimit').error(
      `${diagnostics.target} failed the start-up check: ${diagnostics.scrub(describeCause(error))}; starting anyway: ` +
        `decisions follow failureMode '${settings.failureMode}' while it fails`,
    );
  }
}

/** The oldest Redis the script runs on: `PEXPIRE key ms GT` came with 7.0. */
export const MIN_REDIS_VERSION = [7, 0] as const;

/**
 * The version an `INFO server` reply names when it is older than `MIN_REDIS_VERSION`, else undefined
 * (also when it names none). On an older server the probe below can pass (a new key needs no GT) while
 * every later decision on an existing bucket fails: refused here, at start-up, instead.
 */
export function versionTooOld(info: string): string | undefined {
  const version = /^redis_version:(\d+)\.(\d+)[^\r\n]*/m.exec(info);
  if (version === null) return undefined;
  const [major, minor] = [Number(version[1]), Number(version[2])];
  const [needMajor, needMinor] = MIN_REDIS_VERSION;
  const old = major < needMajor || (major === needMajor && minor < needMinor);
  return old ? version[0].slice('redis_version:'.length) : undefined;
}

/** Asks the server its version; an ACL that refuses INFO (or any error) leaves it unknown: the probe still runs. */
async function serverTooOld(client: RedisClient): Promise<string | undefined> {
  try {
    return versionTooOld(String(await client.info('server')));
  } catch {
    return undefined;
  }
}

const WHAT: Record<'credentials' | 'tls' | 'dns', [string, string, RateLimitErrorCode]> = {
  credentials: ['refused the credentials', 'check redis.username and redis.password (or the URL)', 'ERR_RATE_LIMIT_REDIS_AUTH'],
  tls: ['failed the TLS handshake', 'fix redis.tls (or use redis:// for a server without TLS)', 'ERR_RATE_LIMIT_REDIS_TLS'],
  dns: [
    'is not reachable',
    "check the host name (startupCheck: 'default' starts anyway while it does not resolve)",
    'ERR_RATE_LIMIT_REDIS_UNREACHABLE',
  ],
};

function fail(client: RedisClient, diagnostics: RedisDiagnostics, error: unknown): never {
  client.disconnect();
  const [what, fix, code] = WHAT[classify(error) as 'credentials' | 'tls' | 'dns'];
  const cause = diagnostics.scrub(describeCause(error, Boolean((client.options as RedisOptions).tls)));
  throw new RateLimitConfigError(
    code,
    `RateLimitModule cannot start: ${diagnostics.target} ${what}: ${cause}; ${fix}, or set startupCheck: false to start without this check`,
  );
}

function denied(client: RedisClient, diagnostics: RedisDiagnostics, error: unknown, keyPrefix: string): never {
  client.disconnect();
  const user = (client.options as RedisOptions).username || 'default';
  const reason = diagnostics.scrub(error instanceof Error ? error.message : String(error));
  throw new RateLimitConfigError(
    'ERR_RATE_LIMIT_REDIS_ACL',
    `RateLimitModule cannot start: ${diagnostics.target} does not let user "${user}" run the rate limiter's commands (${reason}); ` +
      `grant them: ACL SETUSER ${user} ~${keyPrefix}* +evalsha +eval +hmget +hget +hgetall +hset +hdel +pexpire +pttl +time +del`,
  );
}
