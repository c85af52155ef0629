import { Redis, type RedisOptions } from 'ioredis';
import { RateLimitError } from '../../errors/rate-limit.errors.js';
import { diagnosticsOf, isReadOnlyError, type RedisDiagnostics } from './redis-diagnostics.js';
import { ownConnection } from './owned-connection.js';
import { checkRedisOption, isRedisClient, type RedisClient } from './redis-options.validation.js';
import { withSentinelDefaults } from './sentinel-watch.js';

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

/**
 * Checks the `redis` option, then builds the client for a URL or options, or takes the caller's client
 * as it is (no listener, no option changed: the application owns it).
 */
export function createRedisClient(redis: unknown): { client: RedisClient; owned: boolean } {
  const option = checkRedisOption(redis);
  if (isRedisClient(option)) return { client: option, owned: false };
  // Assigned once, below, but read first by the reconnect handler built before it: it cannot be a const.
  // eslint-disable-next-line prefer-const
  let client: Redis | undefined;
  const own = typeof option === 'string' ? undefined : option.reconnectOnError;
  // An application that gives its own retryStrategy decides when the client gives up; else the module revives it.
  const revive = typeof option === 'string' || option.retryStrategy === undefined;
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
  client = typeof option === 'string' ? new Redis(option, failFast) : new Redis({ ...withSentinelDefaults(option), ...failFast });
  const diagnostics = diagnosticsOf(client);
  inFlightLossInWords(client, diagnostics);
  if (!revive) diagnostics.retrying = 'the client retries as your retryStrategy says';
  ownConnection(client, diagnostics, revive);
  return { client, owned: true };
}

/**
 * With `maxRetriesPerRequest: 0`, ioredis fails the calls in flight when a connection closes with its
 * MaxRetriesPerRequestError, "Reached the max retries per request limit (which is 0). Refer to
 * "maxRetriesPerRequest" option for details.": words about an option, not about what happened. The
 * module's client fails them with `ERR_RATE_LIMIT_REDIS_NOT_CONNECTED` instead, saying that the
 * connection closed before the answer, that the call is not sent again, and that the client reconnects.
 * ioredis rejects them through `flushQueue(error)` (not public, but stable since ioredis 4); another error
 * passes as it is.
 */
function inFlightLossInWords(client: Redis, diagnostics: RedisDiagnostics): void {
  const flushable = client as unknown as { flushQueue?: (error: Error, options?: unknown) => void };
  const flush = flushable.flushQueue;
  if (typeof flush !== 'function') return;
  flushable.flushQueue = function (this: Redis, error: Error, options?: unknown) {
    const lost =
      error?.name === 'MaxRetriesPerRequestError'
        ? new RateLimitError(
            'ERR_RATE_LIMIT_REDIS_NOT_CONNECTED',
            `the connection to ${diagnostics.target} closed before the answer came; the call is not sent again ` +
              '(it may have been decided on the server), and the client reconnects',
          )
        : error;
    return flush.call(this, lost, options);
  };
}
