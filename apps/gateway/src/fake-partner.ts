import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { performance } from 'node:perf_hooks';
import { Injectable, Logger, type OnModuleDestroy, type OnModuleInit } from '@nestjs/common';

/**
 * A stand-in for a partner's API that allows 5 calls per second for the whole account: a tiny HTTP
 * server the gateway starts on a free local port, which counts what it receives. `GET /quote` answers
 * `{ quote, received }`. Set PARTNER_URL to call a real upstream instead (PartnerClient).
 */
@Injectable()
export class FakePartner implements OnModuleInit, OnModuleDestroy {
  /** When each request arrived (`performance.now()`, ms), in order. */
  readonly arrivals: number[] = [];
  private server: Server | undefined;
  private address = '';

  /** Where it listens, e.g. `http://127.0.0.1:40123` (empty before the module starts). */
  get url(): string {
    return this.address;
  }

  async onModuleInit(): Promise<void> {
    const server = createServer((req, res) => {
      this.arrivals.push(performance.now());
      const received = this.arrivals.length;
      res.setHeader('content-type', 'application/json');
      res.end(JSON.stringify({ quote: 100 + (received % 7), received }));
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    this.server = server;
    this.address = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    new Logger('Gateway').log(`Fake partner API (5 calls/s for all instances) at ${this.address}`);
  }

  async onModuleDestroy(): Promise<void> {
    const server = this.server;
    if (server === undefined) return;
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }
}
