import type { IncomingMessage } from 'node:http';
import type { BucketService } from '../bucket/bucket.service.js';
import { RateLimitConfigError, RateLimitUnavailableError } from '../errors/rate-limit.errors.js';
import type { RateLimitedPayload } from '../rate-limit.exception.js';
import { ipIdentity } from '../keys/identity-keys.js';
import { assertBucketPolicy } from '../bucket/bucket-policy.check.js';
import type { BucketPolicy } from '../rate-limit.interfaces.js';

export interface ConnectionRateLimitOptions extends BucketPolicy {
  /** The bucket's name; each client address gets its own bucket under it. Default `'connect'`. */
  name?: string;
  /**
   * The client address of a handshake. Default: the TCP peer (`request.socket.remoteAddress`). Behind a
   * proxy, read your trusted `X-Forwarded-For` entry here: the app's trust-proxy setting does not apply
   * to WebSocket upgrades.
   */
  getIp?: (request: IncomingMessage) => string | undefined;
}

/** What ws gives `verifyClient`. */
interface VerifyInfo {
  req: IncomingMessage;
}
type VerifyCallback = (result: boolean, code?: number, message?: string, headers?: Record<string, string>) => void;

/**
 * A connection-rate limit for WebSocket gateways: handshakes per client address, drained from a token
 * bucket in Redis like any other (`BucketService`), before the connection is accepted. Nest runs no
 * guard for a connection (`handleConnection`), so this plugs into the server itself:
 *
 * - socket.io: `afterInit(server) { server.use(this.connections.socketIo()) }` — a refused client gets
 *   `connect_error` with `message` 'Too Many Requests' and `data` `{ code: 'RATE_LIMITED', retryAfter }`;
 * - ws: `afterInit(server) { server.options.verifyClient = this.connections.ws() }` — a refused
 *   handshake is answered `429` with `Retry-After`.
 *
 * When Redis fails, `failureMode` decides as for routes: `'open'` accepts, `'closed'` refuses with
 * `RATE_LIMIT_UNAVAILABLE` (ws: 503), `'local'` counts in this process.
 */
export class ConnectionRateLimit {
  private readonly name: string;
  private readonly policy: BucketPolicy;
  private readonly getIp: (request: IncomingMessage) => string | undefined;

  constructor(
    private readonly buckets: BucketService,
    options: ConnectionRateLimitOptions,
  ) {
    assertBucketPolicy(options, 'ConnectionRateLimit', 'ConnectionRateLimit');
    this.name = options.name ?? 'connect';
    if (typeof this.name !== 'string' || this.name === '' || /[{}]/.test(this.name)) {
      throw new RateLimitConfigError(
        'ERR_RATE_LIMIT_INVALID_OPTION',
        `ConnectionRateLimit: name must be a non-empty string without braces (got ${JSON.stringify(options.name)})`,
      );
    }
    this.policy = { capacity: options.capacity, refillPerSecond: options.refillPerSecond };
    this.getIp = options.getIp ?? ((request) => request.socket?.remoteAddress);
  }

  /** Takes a token for the handshake of `request`: undefined when it may connect, else why not. */
  async check(request: IncomingMessage): Promise<RateLimitedPayload | undefined> {
    let address: string | undefined;
    try {
      address = this.getIp(request);
    } catch {
      address = undefined;
    }
    // The normalised address (ip:…, or ip:unknown), as route buckets name it; a bucket per address under `name`.
    const bucket = `${this.name}:${ipIdentity(address)}`;
    try {
      const decision = await this.buckets.consume(bucket, this.policy);
      if (decision.allowed) return undefined;
      return { status: 'error', code: 'RATE_LIMITED', message: 'Too Many Requests', retryAfter: decision.retryAfterSeconds };
    } catch (error) {
      if (!(error instanceof RateLimitUnavailableError)) throw error;
      return { status: 'error', code: 'RATE_LIMIT_UNAVAILABLE', message: 'Rate limiting is unavailable; try again shortly', retryAfter: 1 };
    }
  }

  /** socket.io middleware: `server.use(limit.socketIo())` (or on a namespace). */
  socketIo(): (socket: { request: IncomingMessage }, next: (error?: Error) => void) => void {
    return (socket, next) => {
      this.check(socket.request).then(
        (refused) => {
          if (refused === undefined) return next();
          // A refusal for socket.io's connect_error (message and data go to the client), not a library error.
          next(Object.assign(new Error(refused.message), { data: { code: refused.code, retryAfter: refused.retryAfter } }));
        },
        // A non-Error thrown by the app's code, wrapped as socket.io's next() needs an Error: not a library error.
        (error: unknown) => next(error instanceof Error ? error : new Error(String(error))),
      );
    };
  }

  /** ws `verifyClient`: `server.options.verifyClient = limit.ws()`, or in the gateway's options. */
  ws(): (info: VerifyInfo, callback: VerifyCallback) => void {
    return (info, callback) => {
      this.check(info.req).then(
        (refused) => {
          if (refused === undefined) return callback(true);
          const status = refused.code === 'RATE_LIMITED' ? 429 : 503;
          callback(false, status, refused.message, { 'Retry-After': String(refused.retryAfter) });
        },
        () => callback(false, 500, 'Internal Server Error'),
      );
    };
  }
}
