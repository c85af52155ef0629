import { performance } from 'node:perf_hooks';
import { Logger } from '@nestjs/common';
import { Redis, type RedisOptions } from 'ioredis';
import { type Address, SentinelLookout } from './sentinel-lookout.js';

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

/** While the client waits out a reconnect back-off, the sentinels and the master they name are looked at this often. */
export const LOOKOUT_EVERY_MS = 200;
/** After a wake by a master that answered, the next such wake waits this long at least; doubled per wake without ready. */
const ANSWER_WAKE_FIRST_MS = 1000;
const ANSWER_WAKE_MAX_MS = 30_000;
/** After a switch, a failed attempt is followed by the next at once for this long (then the lookout's looks). */
const SWITCH_WAKES_WITHIN_MS = 10_000;
/** A failover Sentinel could not do is logged once per master within this. */
const ABORT_LOG_EVERY_MS = 10_000;

const show = (a: Address) => `${a.host}:${a.port}`;

/**
 * Follows Sentinel's failovers for a client the module created, so that decisions move to the new
 * master as soon as Sentinel names it, whatever state the old one is in (dead, frozen, or still
 * writable after `SENTINEL FAILOVER`, which Sentinel demotes only ~10 s later).
 *
 * One subscriber connection per sentinel listens to `+selected-slave` (a failover of our master has
 * begun: decisions from now on may be made on a master that is being replaced), `+switch-master` (the
 * new master) and `-failover-abort-no-good-slave` (Sentinel cannot fail over: no replica can be
 * promoted). On a switch, a client still on the old master is moved: disconnected, or woken from its
 * reconnect back-off, so that it asks the sentinels at once; a connection that reaches the old master
 * afterwards (a lookup that raced the switch) is dropped again, and a reconnect attempt under way when
 * the switch came (it may have looked up the old master just before) is followed by the next one at
 * once, not after ioredis' back-off. When the client is ready on another master, one line says so,
 * with the decisions the old master answered after the failover began: Sentinel discards them when it
 * demotes it, so their tokens come back (docs/explanation/exactness.md).
 *
 * While the client waits out a back-off, the watch looks every LOOKOUT_EVERY_MS (`SentinelLookout`):
 * when the sentinels name a master the client was not on, or the master they name answers again (no
 * replica was promoted and the same master came back), the client reconnects at once. ioredis' back-off
 * grows to 5 s; without this a master that came back waited for it.
 *
 * When the events cannot be heard (the subscriber connections silently dead, the sentinels' messages
 * lost), a frozen master is still left: `Liveness` drops a connection that owes a reply and reads
 * nothing for 1 s, and ioredis asks the sentinels again, until they name another master.
 */
export class SentinelWatch {
  private readonly logger = new Logger('RateLimit');
  private readonly subscribers: Redis[] = [];
  private readonly lookout: SentinelLookout;
  /** The master the client is (or was last) ready on. */
  private current: Address | undefined;
  /** The last master Sentinel switched away from, the one it switched to, and when (performance time, ms). */
  private demoted: Address | undefined;
  private promoted: Address | undefined;
  private switchedAt = -Infinity;
  /** When a failover of our master began (`+selected-slave`), while the client is still on the old master. */
  private failoverBeganAt: number | undefined;
  /** Decisions the old master answered since the failover began. */
  private onOldMaster = 0;
  /** When the client's latest connection attempt began ('connecting'), and when its back-off ends. */
  private attemptAt = -Infinity;
  /** Attempts that failed after the switch and were followed by the next at once (up to one per sentinel). */
  private switchWakes = 0;
  /** The watch dropped the client's connection to the demoted master: its back-off is cut without a line. */
  private dropped = false;
  private backoffUntil = 0;
  /** The master a lookup named that the client was woken for (once per master). */
  private wokenFor: Address | undefined;
  /** A master that answers wakes the client again only from then on (performance time, ms). */
  private answerWakeAt = 0;
  private answerWakeMs = ANSWER_WAKE_FIRST_MS;
  private lookoutTimer: NodeJS.Timeout | undefined;
  private looking = false;
  /** The last failover Sentinel could not do, logged: which master, when. */
  private aborted: { master: string; at: number } | undefined;
  private stopped = false;

  constructor(
    private readonly client: Redis,
    private readonly target: string,
  ) {
    const options = client.options;
    this.name = options.name as string;
    this.natMap = options.natMap;
    this.lookout = new SentinelLookout(options, (address) => this.mapped(address));
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
    client.on('connecting', () => (this.attemptAt = performance.now()));
    client.on('reconnecting', (delay: unknown) => this.backingOff(typeof delay === 'number' ? delay : 0));
    client.on('connect', () => this.steer());
    client.on('ready', () => this.ready());
  }

  private readonly name: string;
  private readonly natMap: RedisOptions['natMap'];

  /** Subscribes to every sentinel's events; a sentinel that does not answer is subscribed when it does. */
  start(): void {
    for (const subscriber of this.subscribers) {
      subscriber.connect().catch(() => undefined);
      subscriber.subscribe('+switch-master', '+selected-slave', '-failover-abort-no-good-slave').catch(() => undefined);
    }
  }

  stop(): void {
    this.stopped = true;
    clearTimeout(this.lookoutTimer);
    this.lookoutTimer = undefined;
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
      this.promoted = this.mapped({ host: words[3], port: Number(words[4]) });
      this.switchedAt = performance.now();
      this.switchWakes = 0;
      this.failoverBeganAt ??= this.switchedAt;
      this.steer();
    } else if (channel === '+selected-slave') {
      // slave <ip:port> <ip> <port> @ <name> <master ip> <master port>
      if (words[5] !== this.name) return;
      const master = this.mapped({ host: words[6], port: Number(words[7]) });
      if (this.current === undefined || same(this.current, master)) this.failoverBeganAt ??= performance.now();
    } else if (channel === '-failover-abort-no-good-slave') {
      // master <name> <ip> <port>
      if (words[1] !== this.name || words.length < 4) return;
      this.cannotFailOver(show(this.mapped({ host: words[2], port: Number(words[3]) })));
    }
  }

  /** Sentinel gave up a failover: no replica it could promote. Once per master and ABORT_LOG_EVERY_MS (the sentinels retry). */
  private cannotFailOver(master: string): void {
    const now = performance.now();
    if (this.aborted !== undefined && this.aborted.master === master && now - this.aborted.at < ABORT_LOG_EVERY_MS) return;
    this.aborted = { master, at: now };
    this.failoverBeganAt = undefined;
    this.onOldMaster = 0;
    this.logger.warn(
      `${this.target}: Sentinel could not fail over: no replica of ${this.name} can be promoted (-failover-abort-no-good-slave), ` +
        `so ${master} stays the master; decisions follow failureMode while it does not answer, and the client reconnects ` +
        'as soon as it answers again',
    );
  }

  /** Moves the client off the demoted master: drops its connection there, or ends its back-off. */
  private steer(): void {
    if (this.stopped || this.demoted === undefined) return;
    const status = this.client.status;
    if (status === 'reconnecting') return this.wake(this.switchedWords());
    // 'connecting' (a lookup under way): if this attempt fails, `backingOff` starts the next one at once.
    if (status !== 'connect' && status !== 'ready') return;
    const remote = this.remote();
    if (remote !== undefined && same(remote, this.demoted)) {
      this.dropped = true;
      this.client.disconnect(true);
    }
  }

  /** Whether the client was ready on another master than the demoted one since the switch. */
  private moved(): boolean {
    return this.current !== undefined && this.demoted !== undefined && !same(this.current, this.demoted);
  }

  private switchedWords(): string {
    return `Sentinel switched ${this.name} from ${show(this.demoted!)} to ${show(this.promoted!)}`;
  }

  /** The client failed a connection attempt and waits `delay` ms before the next one (ioredis' retryStrategy). */
  private backingOff(delay: number): void {
    if (this.stopped) return;
    this.backoffUntil = performance.now() + delay;
    // The watch dropped the connection to the demoted master: the lookup starts now, and the line that says
    // where the client decides now (`ready`) is enough.
    if (this.dropped) {
      this.dropped = false;
      return this.wake();
    }
    if (this.demoted !== undefined && !this.moved()) {
      // The attempt that just failed began before Sentinel's switch: it may have looked up the old master.
      if (this.switchedAt > this.attemptAt) return this.wake(`${this.switchedWords()} during a reconnect attempt`);
      // It began after the switch and still failed: the sentinel it asked may not know of the switch yet (the
      // others learn it from the leader's hello messages, up to 2 s later). The next attempt asks the next one.
      if (this.switchWakes < this.subscribers.length && performance.now() - this.switchedAt < SWITCH_WAKES_WITHIN_MS) {
        this.switchWakes++;
        return this.wake(`${this.switchedWords()}, and the last reconnect attempt did not reach ${show(this.promoted!)}`);
      }
    }
    this.scheduleLook();
  }

  /**
   * Ends the client's back-off: connects now. ioredis keeps the timer of its next attempt in
   * `reconnectTimeout` (not public); it is cleared here so that it does not start one more attempt
   * later. Were it not there (another ioredis version), that attempt would find the client connecting
   * or connected and do nothing, or retry early: harmless either way.
   */
  private wake(why?: string): void {
    if (this.stopped || this.client.status !== 'reconnecting') return;
    const left = Math.max(0, Math.round(this.backoffUntil - performance.now()));
    const pending = this.client as unknown as { reconnectTimeout?: NodeJS.Timeout | null };
    if (pending.reconnectTimeout) {
      clearTimeout(pending.reconnectTimeout);
      pending.reconnectTimeout = null;
    }
    if (why !== undefined) this.logger.log(`${this.target}: ${why}; reconnecting now rather than in ${left} ms (ioredis' back-off)`);
    this.client.connect().catch(() => undefined);
  }

  /** The next look while the client is in its back-off, unless the back-off ends before it. */
  private scheduleLook(): void {
    if (this.stopped || this.lookoutTimer !== undefined || this.looking) return;
    if (this.client.status !== 'reconnecting' || this.backoffUntil - performance.now() <= LOOKOUT_EVERY_MS) return;
    // Unref'd: a look must not keep a process alive.
    this.lookoutTimer = setTimeout(() => {
      this.lookoutTimer = undefined;
      void this.look();
    }, LOOKOUT_EVERY_MS).unref();
  }

  /**
   * One look: which master the sentinels name, and, when it is the one the client was on (or one it
   * was already woken for), whether it answers. A master the client was not on wakes it once; one that
   * answers wakes it, then again only after ANSWER_WAKE_FIRST_MS, doubling until the client is ready
   * (a master that answers PING but refuses the client would otherwise make it retry five times a second).
   */
  private async look(): Promise<void> {
    if (this.stopped || this.client.status !== 'reconnecting') return;
    this.looking = true;
    try {
      const named = await this.lookout.master();
      if (named === undefined || this.client.status !== 'reconnecting') return;
      const before = this.current === undefined ? '' : ` (the client was on ${show(this.current)})`;
      if ((this.current === undefined || !same(named, this.current)) && (this.wokenFor === undefined || !same(named, this.wokenFor))) {
        this.wokenFor = named;
        return this.wake(`the sentinels name ${show(named)} as the master of ${this.name}${before}`);
      }
      if (performance.now() < this.answerWakeAt || !(await this.lookout.answers(named))) return;
      this.answerWakeAt = performance.now() + this.answerWakeMs;
      this.answerWakeMs = Math.min(2 * this.answerWakeMs, ANSWER_WAKE_MAX_MS);
      this.wake(`the master ${show(named)} answers again`);
    } finally {
      this.looking = false;
      this.scheduleLook();
    }
  }

  private ready(): void {
    this.answerWakeMs = ANSWER_WAKE_FIRST_MS;
    this.answerWakeAt = 0;
    this.wokenFor = undefined;
    const remote = this.remote();
    if (remote === undefined) return;
    if (this.demoted !== undefined && same(remote, this.demoted)) return this.steer();
    const previous = this.current;
    this.current = remote;
    if (previous === undefined || same(previous, remote)) return;
    const since = Number.isFinite(this.switchedAt) ? `, ${Math.round(performance.now() - this.switchedAt)} ms after Sentinel's switch` : '';
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
