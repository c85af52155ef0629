import type { IncomingMessage } from 'node:http';
import type { HttpAdapterHost } from '@nestjs/core';

/** The client address for a TCP peer and the X-Forwarded-For it sent, as the app's HTTP platform computes `req.ip`. */
type Resolve = (peer: string, forwardedFor: string | undefined) => string | undefined;

/** The app's HTTP server and how its platform resolves addresses; `resolve` undefined: the peer is the client. */
interface Platform {
  server: unknown;
  resolve: Resolve | undefined;
}

/** A documentation address (RFC 5737): forwarded by a peer only to see whether the platform would believe it. */
const PROBE = '192.0.2.1';

/**
 * Client addresses of WebSocket-borne calls (socket.io messages, graphql-ws operations), which reach
 * no HTTP platform's `req.ip`: the handshake request is resolved the way the app resolves its HTTP
 * requests, with its own trust-proxy setting — Express's `app.get('trust proxy fn')`, Fastify's
 * `trustProxy` (read from Fastify's request class, so that every form it accepts means the same). A
 * handshake that came in on another server (a gateway on a port of its own) has no such setting: its
 * TCP peer is the client.
 */
export class ClientAddresses {
  private platform: Platform | undefined;

  /** `host`: Nest's `HttpAdapterHost`, asked lazily (an app without HTTP has none). */
  constructor(private readonly host: () => HttpAdapterHost | undefined) {}

  /** The client address of a handshake (an `IncomingMessage`): `req.ip` as the app's platform would give it. */
  ofRequest(request: IncomingMessage | undefined): string | undefined {
    const peer = request?.socket?.remoteAddress;
    if (peer === undefined) return undefined;
    const resolve = this.resolverFor(request!.socket as { server?: unknown });
    if (resolve === undefined) return peer;
    const header = request!.headers?.['x-forwarded-for'];
    return resolve(peer, Array.isArray(header) ? header.join(',') : header) ?? peer;
  }

  /**
   * The client address of a connection whose handshake headers are gone (ws keeps no request): its TCP
   * peer, or undefined when the app trusts that peer as a proxy — a proxy's address is never taken
   * for a client's, so an allow-listed proxy exempts nobody behind it.
   */
  ofPeer(socket: { remoteAddress?: string; server?: unknown } | undefined): { ip: string | undefined; proxied: boolean } {
    const peer = socket?.remoteAddress;
    if (peer === undefined) return { ip: undefined, proxied: false };
    const resolve = this.resolverFor(socket);
    const proxied = resolve !== undefined && resolve(peer, PROBE) !== peer;
    return { ip: proxied ? undefined : peer, proxied };
  }

  private resolverFor(socket: { server?: unknown } | undefined): Resolve | undefined {
    const platform = (this.platform ??= this.findPlatform());
    if (platform === undefined || socket?.server === undefined || socket.server !== platform.server) return undefined;
    return platform.resolve;
  }

  private findPlatform(): Platform | undefined {
    const adapter = this.host()?.httpAdapter;
    if (adapter === undefined) return undefined;
    const instance = adapter.getInstance() as any;
    const type = adapter.getType();
    let resolve: Resolve | undefined;
    // Express reads the setting per request: so does this (an app may set it after the module is built).
    if (type === 'express') resolve = (peer, header) => walk(peer, header, instance.get('trust proxy fn'));
    else if (type === 'fastify') resolve = fastifyResolve(instance);
    return { server: adapter.getHttpServer(), resolve };
  }
}

/**
 * proxy-addr's walk, which Express applies with its trust function: from the peer back through
 * X-Forwarded-For, each hop trusted moves one further; the first untrusted hop (or the last entry) is the client.
 */
function walk(peer: string, header: string | undefined, trust: unknown): string {
  if (typeof trust !== 'function') return peer;
  const hops = [
    peer,
    ...(header ?? '')
      .split(',')
      .map((entry) => entry.trim())
      .filter((entry) => entry !== '')
      .reverse(),
  ];
  let i = 0;
  while (i < hops.length - 1 && trust(hops[i], i) === true) i++;
  return hops[i];
}

/**
 * Fastify compiles `trustProxy` into the `ip` getter of its request class (kept under the instance's
 * `fastify.Request` symbol). That getter, given a minimal raw request, answers as `request.ip` would.
 * Undefined when this Fastify keeps it elsewhere: the peer is then taken as the client.
 */
function fastifyResolve(instance: object): Resolve | undefined {
  const symbol = Object.getOwnPropertySymbols(instance).find((s) => s.description === 'fastify.Request');
  let proto = symbol === undefined ? undefined : (instance as any)[symbol]?.prototype;
  let get: (() => unknown) | undefined;
  while (proto != null && get === undefined) {
    get = Object.getOwnPropertyDescriptor(proto, 'ip')?.get;
    proto = Object.getPrototypeOf(proto);
  }
  if (get === undefined) return undefined;
  const ip = get;
  return (peer, header) => {
    const socket = { remoteAddress: peer };
    const raw = { socket, connection: socket, headers: header === undefined ? {} : { 'x-forwarded-for': header } };
    const address = ip.call({ raw, socket });
    return typeof address === 'string' ? address : undefined;
  };
}
