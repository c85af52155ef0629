import { performance } from 'node:perf_hooks';
import { Logger } from '@nestjs/common';
import { Redis, type RedisOptions } from 'ioredis';

/**
 * What a client the module creates for `redis: { sentinels, name }` gets unless the options set it
 * (docs/guides/redis-sentinel.md):
 * - `sentinelCommandTimeout: 1000`: a sentinel that accepts the connection but never answers (frozen)
 *   no longer holds the lookup of the master; the next sentinel is asked.
 * Not `socketTimeout`: a plain timer that a handler holding the event loop past it lets fire before the
 * waiting reply is read, dropping a healthy connection. A frozen master is left by `Liveness` instead
 * (the same 1 s without a byte back, the app's own stalls not counted), unless the options set
 * `socketTimeout` (then it is theirs, with that caveat).
 * Not `failoverDetector`: `SentinelWatch` listens to the same `+switch-master` events, and also counts
 * and logs what the switch cost; ioredis' detector, when its disconnect meets a reconnect in progress,
 * can end the client for good.
 */
export const SENTINEL_DEFAULTS = { sentinelCommandTimeout: 1000 } as const;

/** `options` with `SENTINEL_DEFAULTS` where they are not set; other options as they are. */
export function withSentinelDefaults(options: RedisOptions): RedisOptions {
  if (!isSentinel(options)) return options;
  const out: RedisOptions = { ...options };
  for (const [key, value] of Object.entries(SENTINEL_DEFAULTS)) {
    if ((options as Record<string, unknown>)[key] === undefined) (out as Record<string, unknown>)[key] = value;
  }
  return out;
}

export function isSentinel(options: Partial<RedisOptions> | undefined): boolean {
  return Array.isArray(options?.sentinels) && options.sentinels.length > 0 && typeof options.name === 'string';
}

/** A failover that began this long ago without a switch is over (Sentinel aborted it). */
const FAILOVER_FORGOTTEN_MS = 60_000;

interface Address {
  host: string;
  port: number;
}

const show = (a: Address) => `${a.host}:${a.port}`;

/**
 * Follows Sentinel's failovers for a client the module created, so that decisions move to the new
 * master as soon as Sentinel names it, whatever state the old one is in (dead, frozen, or still
 * writable after `SENTINEL FAILOVER`, which Sentinel demotes only ~10 s later).
 *
 * One subscriber connection per sentinel listens to `+selected-slave` (a failover of our master has
 * begun: decisions from now on may be made on a master that is being replaced) and `+switch-master`
 * (the new master). On a switch, a client still on the old master is moved: disconnected, or woken
 * from its reconnect back-off, so that it asks the sentinels at once; a connection that reaches the old
 * master afterwards (a lookup that raced the switch) is dropped again. When the client is ready on
 * another master, one line says so, with the decisions the old master answered after the failover
 * began: Sentinel discards them when it demotes it, so their tokens come back (docs/explanation/exactness.md).
 *
 * When the events cannot be heard (the subscriber connections silently dead, the sentinels' messages
 * lost), a frozen master is still left: `Liveness` drops a connection that owes a reply and reads
 * nothing for 1 s, and ioredis asks the sentinels again, until they name another master.
 */
export class SentinelWatch {
  private readonly logger = new Logger('RateLimit');
  private readonly subscribers: Redis[] = [];
  /** The master the client is (or was last) ready on. */
  private current: Address | undefined;
  /** The last master Sentinel switched away from, and when (performance time, ms). */
  private demoted: Address | undefined;
  private switchedAt = 0;
  /** When a failover of our master began (`+selected-slave`), while the client is still on the old master. */
  private failoverBeganAt: number | undefined;
  /** Decisions the old master answered since the failover began. */
  private onOldMaster = 0;
  private stopped = false;

  constructor(
    private readonly client: Redis,
    private readonly target: string,
  ) {
    const options = client.options;
    this.name = options.name as string;
    this.natMap = options.natMap;
    for (const sentinel of options.sentinels ?? []) {
      const subscriber = new Redis({
        host: sentinel.host ?? 'localhost',
        port: sentinel.port ?? 26379,
        family: sentinel.family ?? options.family,
        username: options.sentinelUsername ?? undefined,
        password: options.sentinelPassword ?? undefined,
        tls: options.sentinelTLS,
        connectTimeout: options.connectTimeout,
        // A sentinel that is down is asked again, every few seconds at most; it costs one connection attempt.
        retryStrategy: (times) => Math.min(times * 500, 5000),
        maxRetriesPerRequest: null,
        lazyConnect: true,
      });
      subscriber.on('error', () => undefined);
      subscriber.on('message', (channel: string, message: string) => this.event(channel, message));
      this.subscribers.push(subscriber);
    }
    client.on('connect', () => this.steer());
    client.on('ready', () => this.ready());
  }

  private readonly name: string;
  private readonly natMap: RedisOptions['natMap'];

  /** Subscribes to every sentinel's events; a sentinel that does not answer is subscribed when it does. */
  start(): void {
    for (const subscriber of this.subscribers) {
      subscriber.connect().catch(() => undefined);
      subscriber.subscribe('+switch-master', '+selected-slave').catch(() => undefined);
    }
  }

  stop(): void {
    this.stopped = true;
    for (const subscriber of this.subscribers) subscriber.disconnect();
  }

  /** A decision answered by the client's current connection. */
  answered(decisions: number): void {
    if (this.failoverBeganAt === undefined) return;
    // A failover that began and never switched (aborted) stops counting after a while.
    if (performance.now() - this.failoverBeganAt > FAILOVER_FORGOTTEN_MS) {
      this.failoverBeganAt = undefined;
      this.onOldMaster = 0;
      return;
    }
    this.onOldMaster += decisions;
  }

  private event(channel: string, message: string): void {
    const words = message.split(' ');
    if (channel === '+switch-master') {
      // <name> <old ip> <old port> <new ip> <new port>
      if (words[0] !== this.name || words.length < 5) return;
      const demoted = this.mapped({ host: words[1], port: Number(words[2]) });
      if (this.demoted !== undefined && same(this.demoted, demoted) && performance.now() - this.switchedAt < 1000) return;
      this.demoted = demoted;
      this.switchedAt = performance.now();
      this.failoverBeganAt ??= this.switchedAt;
      this.steer();
    } else if (channel === '+selected-slave') {
      // slave <ip:port> <ip> <port> @ <name> <master ip> <master port>
      if (words[5] !== this.name) return;
      const master = this.mapped({ host: words[6], port: Number(words[7]) });
      if (this.current === undefined || same(this.current, master)) this.failoverBeganAt ??= performance.now();
    }
  }

  /** Moves the client off the demoted master: drops its connection there, or ends its back-off. */
  private steer(): void {
    if (this.stopped || this.demoted === undefined) return;
    const status = this.client.status;
    if (status === 'reconnecting') {
      // Waiting out its back-off: ask the sentinels now; the pending retry finds it connecting and does nothing.
      this.client.connect().catch(() => undefined);
      return;
    }
    if (status !== 'connect' && status !== 'ready') return;
    const remote = this.remote();
    if (remote !== undefined && same(remote, this.demoted)) this.client.disconnect(true);
  }

  private ready(): void {
    const remote = this.remote();
    if (remote === undefined) return;
    if (this.demoted !== undefined && same(remote, this.demoted)) return this.steer();
    const previous = this.current;
    this.current = remote;
    if (previous === undefined || same(previous, remote)) return;
    const since = this.demoted !== undefined ? `, ${Math.round(performance.now() - this.switchedAt)} ms after Sentinel's switch` : '';
    const lost =
      this.onOldMaster > 0
        ? `; ${this.onOldMaster} decision(s) were made on ${show(previous)} after the failover began: it is demoted, ` +
          'and what they took is lost with it'
        : '; no decision was made on the old master after the failover began';
    this.logger.log(`${this.target}: now deciding on ${show(remote)} (was ${show(previous)})${since}${lost}`);
    this.failoverBeganAt = undefined;
    this.onOldMaster = 0;
  }

  /** The address of the client's connection, when it has one. */
  private remote(): Address | undefined {
    const stream = (this.client as unknown as { stream?: { remoteAddress?: string; remotePort?: number } }).stream;
    if (stream?.remoteAddress === undefined || stream.remotePort === undefined) return undefined;
    return { host: stream.remoteAddress.replace(/^::ffff:/, ''), port: stream.remotePort };
  }

  /** An address Sentinel names, as the client reaches it (`natMap`). */
  private mapped(address: Address): Address {
    const map = this.natMap;
    if (!map) return address;
    const key = show(address);
    const found = typeof map === 'function' ? map(key) : map[key];
    return found ? { host: found.host, port: found.port } : address;
  }
}

function same(a: Address, b: Address): boolean {
  return a.port === b.port && (a.host === b.host || (isLoopback(a.host) && isLoopback(b.host)));
}

function isLoopback(host: string): boolean {
  return host === 'localhost' || host === '::1' || host.startsWith('127.');
}
