import { Redis, type RedisOptions } from 'ioredis';

/** A host and a port, as Sentinel names a master (after `natMap`). */
export interface Address {
  host: string;
  port: number;
}

/** The longest a look (one sentinel asked, or the master pinged) may take before it counts as no answer. */
export const LOOK_TIMEOUT_MS = 500;

/** A throwaway connection: one attempt, no retry, no ready check, given up on after `ms`. */
function oneShot(options: RedisOptions, ms: number): Redis {
  const client = new Redis({
    ...options,
    connectTimeout: ms,
    commandTimeout: ms,
    retryStrategy: () => null,
    reconnectOnError: null,
    enableReadyCheck: false,
    maxRetriesPerRequest: 0,
    lazyConnect: true,
  });
  client.on('error', () => undefined);
  return client;
}

/**
 * The short lookups `SentinelWatch` makes while the client waits out a reconnect back-off: which master
 * the sentinels name now, and whether it answers. Each opens its own connection and closes it, as
 * ioredis does for its own lookups; none keeps anything open between two looks.
 */
export class SentinelLookout {
  /**
   * The sentinel asked first: the one after the sentinel that answered last. Each look asks another, so
   * that one that has not heard of a switch yet (Sentinel's other instances learn it up to 2 s after the
   * leader) does not hide it look after look.
   */
  private first = 0;

  constructor(
    private readonly options: RedisOptions,
    private readonly mapped: (address: Address) => Address,
    private readonly ms = LOOK_TIMEOUT_MS,
  ) {}

  /** The master the first sentinel that answers names (`SENTINEL GET-MASTER-ADDR-BY-NAME`); undefined when none does. */
  async master(): Promise<Address | undefined> {
    const sentinels = this.options.sentinels ?? [];
    for (let i = 0; i < sentinels.length; i++) {
      const index = (this.first + i) % sentinels.length;
      const sentinel = sentinels[index];
      const client = oneShot(
        {
          host: sentinel.host ?? 'localhost',
          port: sentinel.port ?? 26379,
          family: sentinel.family ?? this.options.family,
          username: this.options.sentinelUsername ?? undefined,
          password: this.options.sentinelPassword ?? undefined,
          tls: this.options.sentinelTLS,
        },
        this.ms,
      );
      try {
        await client.connect();
        const reply = await client.call('SENTINEL', 'GET-MASTER-ADDR-BY-NAME', this.options.name as string);
        if (Array.isArray(reply) && reply.length >= 2) {
          this.first = index + 1;
          return this.mapped({ host: String(reply[0]), port: Number(reply[1]) });
        }
      } catch {
        // The next sentinel.
      } finally {
        client.disconnect();
      }
    }
    return undefined;
  }

  /**
   * Whether `address` accepts a connection of the client's own credentials and answers PING: what the
   * client's reconnect needs. A master that is down, frozen, still loading its data, or refuses the
   * password answers false.
   */
  async answers(address: Address): Promise<boolean> {
    const options = this.options;
    const client = oneShot(
      {
        host: address.host,
        port: address.port,
        family: options.family,
        username: options.username,
        password: options.password,
        tls: options.enableTLSForSentinelMode ? options.tls : undefined,
      },
      this.ms,
    );
    try {
      await client.connect();
      return (await client.ping()) === 'PONG';
    } catch {
      return false;
    } finally {
      client.disconnect();
    }
  }
}
