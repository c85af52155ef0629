import type { ExecutionContext } from '@nestjs/common';
import type { ClientAddresses } from './client-address.js';

/** The transports whose handlers the limiter decides. */
export type CallKind = 'http' | 'graphql' | 'ws' | 'rpc';

/**
 * One call the limiter decides, seen the same way whatever the transport:
 * - `carrier`: the object its state is kept on (under `RATE_LIMIT_VERDICT`) between the guard and the
 *   interceptor — the HTTP request; for GraphQL the resolver's arguments, since every field of an
 *   operation shares one HTTP request and each is decided on its own;
 * - `request`: what the identity hooks read (`getIp`, `getUserId`, `getApiKey`, `keys.*`);
 * - `response`: where headers go, or undefined when there is none (a GraphQL subscription).
 */
export interface LimitedCall {
  kind: CallKind;
  carrier: any;
  request: any;
  response: any;
  /** A ws message through a proxy the app trusts: no handshake headers say whose it is (`ip` is undefined). */
  proxied?: boolean;
}

/**
 * The call of `context`, or undefined for a transport the limiter does not decide (see `undecidedKind`).
 * `addresses` resolves WebSocket clients' addresses with the app's trust-proxy setting.
 */
export function limitedCall(context: ExecutionContext, addresses: ClientAddresses): LimitedCall | undefined {
  const type = context.getType<string>();
  if (type === 'http') {
    const http = context.switchToHttp();
    const request = http.getRequest();
    return { kind: 'http', carrier: request, request, response: http.getResponse() };
  }
  if (type === 'graphql') return graphqlCall(context);
  if (type === 'ws') return wsCall(context, addresses);
  if (type === 'rpc') return rpcCall(context);
  return undefined;
}

/**
 * A resolver's call. Its arguments are `[root, args, context, info]`; the GraphQL context holds the
 * HTTP request as `req` (Apollo) or `request` (Mercurius, and Mercurius subscriptions), its response as
 * `res`, `req.res` (Apollo over Express) or `reply` (Mercurius). A subscription over graphql-ws has
 * the connection's context as `req`, with the upgrade request at `extra.request` and no response.
 * Read without importing `@nestjs/graphql`: the library does not depend on it.
 */
function graphqlCall(context: ExecutionContext): LimitedCall {
  const args = context.getArgs();
  const gql = (args[2] ?? {}) as Record<string, any>;
  const raw = gql.req ?? gql.request;
  const request = raw?.extra?.request ?? raw ?? {};
  const response = gql.res ?? raw?.res ?? gql.reply;
  return { kind: 'graphql', carrier: args, request, response };
}

/**
 * A WebSocket message: its arguments are `[client, data, ack?, pattern]`. The hooks get a request view
 * of the connection: `ip` (socket.io: the handshake's client address, with the app's trust-proxy
 * setting; ws: the TCP peer, as ws keeps no request — undefined when the app trusts it as a proxy),
 * `headers` (the handshake's), `user` (`client.data.user` or `client.user`, as your auth sets it),
 * `client`. No response: no headers.
 */
function wsCall(context: ExecutionContext, addresses: ClientAddresses): LimitedCall {
  const args = context.getArgs();
  const client = (args[0] ?? {}) as Record<string, any>;
  const handshake = client.handshake as Record<string, any> | undefined;
  if (handshake) {
    const ip = client.request === undefined ? handshake.address : addresses.ofRequest(client.request);
    const request = { ip, headers: handshake.headers ?? {}, user: client.data?.user ?? client.user, client };
    return { kind: 'ws', carrier: args, request, response: undefined };
  }
  const { ip, proxied } = addresses.ofPeer(client._socket);
  return { kind: 'ws', carrier: args, request: { ip, headers: {}, user: client.user, client }, response: undefined, proxied };
}

/**
 * A microservice message or event: `[data, context]`. The request view has `ip` where the transport
 * has a peer (TCP), `data` (the payload, for keyBy functions) and `context`; identities usually come
 * from the payload through a keyBy function.
 */
function rpcCall(context: ExecutionContext): LimitedCall {
  const args = context.getArgs();
  const rpc = args[1] as { getSocketRef?: () => { socket?: { remoteAddress?: string } } } | undefined;
  let ip: string | undefined;
  try {
    ip = rpc?.getSocketRef?.()?.socket?.remoteAddress;
  } catch {
    ip = undefined;
  }
  return { kind: 'rpc', carrier: args, request: { ip, headers: {}, data: args[0], context: rpc }, response: undefined };
}
