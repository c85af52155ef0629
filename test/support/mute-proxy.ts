import { connect, createServer, type Server, type Socket } from 'node:net';

/**
 * A TCP relay to 127.0.0.1:`target` that can silence the connections it carries, as a firewall or a
 * NAT that dropped their state does: after `mute()`, nothing more passes on a connection opened
 * before it, in either direction, and neither end is told (no FIN, no RST); connections opened after
 * it pass as usual. Sentinel's events to a long-lived subscriber are then lost while every new lookup
 * still works.
 */
export class MuteProxy {
  private readonly pairs: [Socket, Socket][] = [];

  private constructor(private readonly server: Server) {}

  static async start(target: number): Promise<MuteProxy> {
    const server = createServer();
    const proxy = new MuteProxy(server);
    server.on('connection', (client) => {
      const upstream = connect(target, '127.0.0.1');
      client.on('error', () => upstream.destroy());
      upstream.on('error', () => client.destroy());
      client.on('close', () => upstream.destroy());
      upstream.on('close', () => client.destroy());
      client.pipe(upstream);
      upstream.pipe(client);
      proxy.pairs.push([client, upstream]);
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    return proxy;
  }

  get port(): number {
    return (this.server.address() as { port: number }).port;
  }

  /** Every connection open now carries nothing more; both ends stay open. */
  mute(): void {
    for (const [client, upstream] of this.pairs) {
      client.unpipe(upstream);
      upstream.unpipe(client);
      client.pause();
      upstream.pause();
    }
  }

  async close(): Promise<void> {
    for (const [client, upstream] of this.pairs.splice(0)) {
      client.destroy();
      upstream.destroy();
    }
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }
}
