import { Redis } from 'ioredis';
import { ThrottledLogger } from '../../throttled-logger.js';
import type { RedisDiagnostics } from './redis-diagnostics.js';
import type { RedisClient } from './redis-options.validation.js';
import { Liveness } from './liveness.js';
import { isSentinel, SentinelWatch } from './sentinel-watch.js';

/** The first wait before a client that ended is connected again; doubled per failed try, up to REVIVE_MAX_MS. */
const REVIVE_FIRST_MS = 100;
const REVIVE_MAX_MS = 2000;

/**
 * What the module adds to a client it created, from `start()` (module init) to `stop()` (shutdown):
 * - an ended client is connected again. ioredis ends a client for good when a reconnect fails in a way
 *   its retry strategy does not cover (a Sentinel lookup cut short by a disconnect: "Connection is
 *   closed"); without this the module answered `failureMode` until the app restarted. Not when the
 *   application gave a `retryStrategy` of its own: then ending is its choice.
 * - with `redis: { sentinels, name }`, the `SentinelWatch` that follows failovers, and the `Liveness`
 *   check that leaves a master that stopped answering (unless the application set `socketTimeout`:
 *   then ioredis' timer is its choice).
 */
export class OwnedConnection {
  readonly watch: SentinelWatch | undefined;
  readonly liveness: Liveness | undefined;
  private readonly logger = new ThrottledLogger('RateLimit');
  private stopped = true;
  private reviveMs = REVIVE_FIRST_MS;
  private timer: NodeJS.Timeout | undefined;

  constructor(
    private readonly client: RedisClient,
    private readonly diagnostics: RedisDiagnostics,
    /** Connect an ended client again (false: the application's own retryStrategy decides). */
    readonly revive: boolean,
  ) {
    const sentinel = client instanceof Redis && isSentinel(client.options);
    this.watch = sentinel ? new SentinelWatch(client as Redis, diagnostics.target) : undefined;
    this.liveness =
      sentinel && client.options.socketTimeout === undefined
        ? new Liveness(client as Redis, (silentMs, owed) => this.silent(silentMs, owed))
        : undefined;
    client.on('end', () => this.ended());
    client.on('ready', () => (this.reviveMs = REVIVE_FIRST_MS));
  }

  start(): void {
    this.stopped = false;
    this.watch?.start();
    this.liveness?.start();
  }

  /** Shutdown (or an abandoned start): nothing is connected again. */
  stop(): void {
    this.stopped = true;
    clearTimeout(this.timer);
    this.watch?.stop();
    this.liveness?.stop();
  }

  /** `decisions` answered by the client's current connection. */
  answered(decisions: number): void {
    this.watch?.answered(decisions);
  }

  /** A script call handed to the client: `Liveness` waits for its reply. */
  track(call: Promise<unknown>): void {
    const liveness = this.liveness;
    if (liveness === undefined) return;
    liveness.sent();
    const settled = () => liveness.settled();
    call.then(settled, settled);
  }

  private silent(silentMs: number, owed: string): void {
    this.logger.warn(
      this.diagnostics.scrub(
        `${this.diagnostics.target}: no byte back for ${Math.round(silentMs)} ms while it owed ${owed} (the app's own stalls ` +
          'not counted): the connection is dropped and the sentinels are asked for the master again',
      ),
    );
  }

  private ended(): void {
    if (this.stopped || !this.revive) return;
    const wait = this.reviveMs;
    this.reviveMs = Math.min(2 * wait, REVIVE_MAX_MS);
    const cause = this.diagnostics.cause();
    this.logger.warn(
      this.diagnostics.scrub(
        `The connection to ${this.diagnostics.target} ended: ioredis stopped reconnecting${cause ? ` (last error: ${cause})` : ''}; ` +
          `the module connects it again in ${wait} ms, and so on until it answers; decisions follow failureMode meanwhile`,
      ),
    );
    clearTimeout(this.timer);
    this.timer = setTimeout(() => {
      if (!this.stopped && this.client.status === 'end') this.client.connect().catch(() => undefined);
    }, wait);
    this.timer.unref();
  }
}

const CONNECTIONS = new WeakMap<RedisClient, OwnedConnection>();

/** Registers what the module adds to a client it created (once, by `createRedisClient`). */
export function ownConnection(client: RedisClient, diagnostics: RedisDiagnostics, revive: boolean): OwnedConnection {
  let connection = CONNECTIONS.get(client);
  if (!connection) {
    connection = new OwnedConnection(client, diagnostics, revive);
    CONNECTIONS.set(client, connection);
  }
  return connection;
}

/** The additions of a client the module created; undefined for a client the application passed in. */
export function ownedConnectionOf(client: RedisClient): OwnedConnection | undefined {
  return CONNECTIONS.get(client);
}
