import { performance } from 'node:perf_hooks';
import type { Socket } from 'node:net';
import type { Redis } from 'ioredis';

/** A connection that reads no byte for this long while it owes a reply is dropped (`Liveness`). */
export const LIVENESS_MS = 1000;

/**
 * Leaves a server that stopped answering (a frozen master: SIGSTOP, a dead network path) without
 * taking the app's own stalls for it. Used for a Sentinel client the module creates, in place of
 * ioredis' `socketTimeout`.
 *
 * While the connection owes something — script calls outstanding (`sent` .. `settled`), or the
 * handshake of a new connection (status `connect`: ioredis waits for INFO before `ready`) — and no
 * byte has been read from it for `ms`, the connection is dropped with `disconnect(true)`: ioredis
 * reconnects and asks the sentinels for the master again.
 *
 * Why not `socketTimeout`: it is a plain timer armed at the write and cleared by the next 'data'
 * event. A handler that holds the event loop longer than it (a synchronous hash, a large JSON) lets
 * the timer expire, and Node runs expired timers before it reads sockets: a reply already waiting is
 * never read, a healthy connection is destroyed and every pending decision goes to `failureMode`. Here,
 * as for the decisions' deadline (`Deadlines`), the timer only looks again after the poll phase
 * (`setImmediate`): a reply that arrived during the stall is read first, and counts as a sign of life.
 *
 * One timer at most, re-armed for what remains rather than per call.
 */
export class Liveness {
  private outstanding = 0;
  /** When the connection last showed life: a byte read, or the start of a wait (performance time, ms). */
  private since = 0;
  private timer: NodeJS.Timeout | undefined;
  private stopped = true;
  private stream: Socket | undefined;

  constructor(
    private readonly client: Redis,
    /** Called after the connection was dropped, with how long it had been silent (ms) and what it owed. */
    private readonly dropped: (silentMs: number, owed: string) => void,
    private readonly ms = LIVENESS_MS,
  ) {
    client.on('connect', () => this.connected());
  }

  start(): void {
    this.stopped = false;
    if (this.client.status === 'connect') this.connected();
  }

  stop(): void {
    this.stopped = true;
    clearTimeout(this.timer);
    this.timer = undefined;
  }

  /** A script call was written: its reply is owed. */
  sent(): void {
    if (this.outstanding++ === 0) this.since = performance.now();
    this.arm(this.ms);
  }

  /** A script call settled (answered, or failed with its connection). */
  settled(): void {
    if (this.outstanding > 0) this.outstanding--;
  }

  /** A new connection: its handshake is owed; every byte it reads is a sign of life. */
  private connected(): void {
    const stream = (this.client as unknown as { stream?: Socket }).stream;
    if (stream !== undefined && stream !== this.stream) {
      this.stream = stream;
      stream.on('data', () => (this.since = performance.now()));
    }
    this.since = performance.now();
    this.arm(this.ms);
  }

  private owed(): string | undefined {
    const status = this.client.status;
    if (status === 'connect') return 'its handshake (INFO)';
    if (status === 'ready' && this.outstanding > 0) return `${this.outstanding} script call(s)`;
    return undefined;
  }

  private arm(delay: number): void {
    if (this.stopped || this.timer !== undefined) return;
    // Unref'd: waiting for a reply must not keep a process alive (its socket does that).
    this.timer = setTimeout(() => setImmediate(this.check), delay).unref();
  }

  /** After the poll phase: replies that arrived while the loop was held have been read by now. */
  private readonly check = (): void => {
    this.timer = undefined;
    if (this.stopped) return;
    const owed = this.owed();
    if (owed === undefined) return;
    const silent = performance.now() - this.since;
    if (silent < this.ms) return this.arm(Math.max(1, Math.ceil(this.ms - silent)));
    this.client.disconnect(true);
    this.dropped(silent, owed);
  };
}
