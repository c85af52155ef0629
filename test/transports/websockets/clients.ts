import { createHash } from 'node:crypto';
import { io, type Socket, type ManagerOptions, type SocketOptions } from 'socket.io-client';
import WebSocket, { type ClientOptions } from 'ws';

/** The digest the README documents for an API key without `keys.secret`: SHA-256, its first 32 hex digits. */
export const sha = (value: string): string => createHash('sha256').update(value).digest('hex').slice(0, 32);

/** The refusal a client receives (README "WebSockets"); capacity B refilled at 0.01/s: the next token is 100 s away. */
export const RATE_LIMITED = { status: 'error', code: 'RATE_LIMITED', message: 'Too Many Requests', retryAfter: 100 };
export const UNAVAILABLE = {
  status: 'error',
  code: 'RATE_LIMIT_UNAVAILABLE',
  message: 'Rate limiting is unavailable; try again shortly',
  retryAfter: 1,
};

/** `payload.retryAfter` is an integer of at least 1, as the README promises for every wait. */
export function expectWholeSeconds(payload: { retryAfter?: unknown }): void {
  expect(Number.isInteger(payload.retryAfter)).toBe(true);
  expect(payload.retryAfter as number).toBeGreaterThanOrEqual(1);
}

/** Resolves once `count()` reaches `n`, then waits `settleMs` more so that an extra answer would show; rejects after `timeoutMs`. */
export async function until(count: () => number, n: number, what: string, timeoutMs = 5000, settleMs = 150): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (count() < n) {
    if (Date.now() > deadline) throw new Error(`waited ${timeoutMs} ms for ${n} ${what}, got ${count()}`);
    await new Promise((r) => setTimeout(r, 10));
  }
  await new Promise((r) => setTimeout(r, settleMs));
}

/** A socket.io client that records every event it receives, by name. */
export interface IoClient {
  socket: Socket;
  events: Map<string, unknown[]>;
  received(event: string): unknown[];
}

/**
 * socket.io-client options; `localAddress` (the source address, e.g. 127.0.0.2 to speak for a second
 * client) is passed on to the Node `ws` transport by engine.io-client but missing from its types.
 */
export type IoOptions = Partial<ManagerOptions & SocketOptions> & { localAddress?: string };

/** Opens a socket.io connection (websocket transport, no reconnection) and waits until it is connected. */
export async function ioClient(url: string, options: IoOptions = {}, opened: IoClient[] = []): Promise<IoClient> {
  const socket = io(url, { transports: ['websocket'], reconnection: false, forceNew: true, ...options });
  const events = new Map<string, unknown[]>();
  const client: IoClient = { socket, events, received: (event) => events.get(event) ?? [] };
  opened.push(client);
  socket.onAny((event: string, ...args: unknown[]) => {
    if (!events.has(event)) events.set(event, []);
    events.get(event)!.push(args.length === 1 ? args[0] : args);
  });
  await new Promise<void>((resolve, reject) => {
    socket.once('connect', () => resolve());
    socket.once('connect_error', reject);
  });
  return client;
}

/** A ws client that records every message it receives (parsed JSON). */
export interface WsClient {
  socket: WebSocket;
  messages: { event: string; data: any }[];
  of(event: string): any[];
  send(event: string, data: unknown): void;
}

export async function wsClient(url: string, options: ClientOptions = {}, opened: WsClient[] = []): Promise<WsClient> {
  const socket = new WebSocket(url, options);
  const messages: { event: string; data: any }[] = [];
  const client: WsClient = {
    socket,
    messages,
    of: (event) => messages.filter((m) => m.event === event).map((m) => m.data),
    send: (event, data) => socket.send(JSON.stringify({ event, data })),
  };
  opened.push(client);
  socket.on('message', (raw) => messages.push(JSON.parse(String(raw))));
  await new Promise<void>((resolve, reject) => {
    socket.once('open', () => resolve());
    socket.once('error', reject);
  });
  socket.on('error', () => undefined);
  return client;
}

/** Closes every client, whatever state it is in. */
export async function closeAll(io: IoClient[], ws: WsClient[]): Promise<void> {
  for (const c of io) c.socket.close();
  await Promise.all(
    ws.map(
      (c) =>
        new Promise<void>((resolve) => {
          if (c.socket.readyState === WebSocket.CLOSED) return resolve();
          c.socket.once('close', () => resolve());
          c.socket.terminate();
        }),
    ),
  );
}
