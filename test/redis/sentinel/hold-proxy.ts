import { connect, createServer, type Server, type Socket } from 'node:net';
import { performance } from 'node:perf_hooks';

/**
 * A TCP relay to 127.0.0.1:`target` (a sentinel) that can hold back the answers to lookups of the
 * master: after `hold()`, a connection that sends `SENTINEL GET-MASTER-ADDR-BY-NAME` has that request
 * carried to the sentinel at once, but the sentinel's reply (and anything after it on that connection)
 * waits in the relay until `release()`. A lookup that reaches the sentinel before Sentinel's switch is
 * then answered with the old master, after the switch: the race of a reconnect that looked up the dead
 * master just before the switch. What comes before the lookup on a connection (its handshake, HELLO)
 * and every other connection (the app's subscriptions) pass as usual.
 */
export class HoldProxy {
  private holding = false;
  private readonly held: { client: Socket; buffered: Buffer[]; holding: boolean }[] = [];
  private readonly sockets = new Set<Socket>();
  /** When each held lookup reached the sentinel (`performance.now()`). */
  readonly heldLookups: number[] = [];

  private constructor(private readonly server: Server) {}

  static async start(target: number): Promise<HoldProxy> {
    const server = createServer();
    const proxy = new HoldProxy(server);
    server.on('connection', (client) => proxy.relay(client, target));
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    return proxy;
  }

  private relay(client: Socket, target: number): void {
    const upstream = connect(target, '127.0.0.1');
    this.sockets.add(client).add(upstream);
    const entry = { client, buffered: [] as Buffer[], holding: false };
    client.on('error', () => upstream.destroy());
    upstream.on('error', () => client.destroy());
    client.on('close', () => upstream.destroy());
    upstream.on('close', () => client.destroy());
    client.on('data', (chunk: Buffer) => {
      if (this.holding && !entry.holding && /get-master-addr-by-name/i.test(chunk.toString('latin1'))) {
        entry.holding = true;
        this.held.push(entry);
        this.heldLookups.push(performance.now());
      }
      upstream.write(chunk);
    });
    upstream.on('data', (chunk: Buffer) => (entry.holding ? entry.buffered.push(chunk) : client.write(chunk)));
  }

  get port(): number {
    return (this.server.address() as { port: number }).port;
  }

  /** From now on, the replies to lookups of the master are held until `release()`. */
  hold(): void {
    this.holding = true;
  }

  /** Delivers every held reply, in order, and lets everything pass from now on. */
  release(): void {
    this.holding = false;
    for (const entry of this.held.splice(0)) {
      entry.holding = false;
      if (!entry.client.destroyed) for (const chunk of entry.buffered.splice(0)) entry.client.write(chunk);
    }
  }

  async close(): Promise<void> {
    for (const socket of this.sockets) socket.destroy();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }
}
