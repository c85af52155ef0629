import { type ExecutionContext, ForbiddenException, IntrinsicException, ServiceUnavailableException } from '@nestjs/common';
import type { RateLimitHeadersWriter } from '../headers/rate-limit-headers.writer.js';
import { type RateLimitedPayload, RateLimitedGraphQLError, RateLimitException, withoutStack } from '../rate-limit.exception.js';
import type { Verdict } from '../rate-limit.interfaces.js';
import { ThrottledLogger } from '../throttled-logger.js';
import type { RequestState } from './request-state.js';
import { longestWait } from './verdict.js';

/**
 * Refuses a request, as its transport's client understands a refusal (`refusalFor`): the headers first,
 * then what `failureMode: 'closed'` or the request's `throwRateLimitException` hook throws.
 */
export class Refusals {
  /** Microservice events refused, which no client hears of: a throttled warning per handler. */
  private readonly dropLoggers = new Map<string, ThrottledLogger>();

  constructor(
    private readonly headers: RateLimitHeadersWriter,
    private readonly timeoutMs: number,
    /** What a blocked identity gets over HTTP (`operations.blockedStatus`). */
    private readonly blockedStatus: 429 | 403 = 429,
  ) {}

  /** The default `throwRateLimitException` hook: the refusal of the call's transport, with the longest wait. */
  readonly throwRateLimited = (context: ExecutionContext, verdict: Verdict): never => {
    throw refusalFor(context, longestWait(verdict), 'RATE_LIMITED');
  };

  refuse(context: ExecutionContext, response: unknown, state: RequestState, verdict: Verdict): never {
    if (state.kind === 'rpc' && isEventHandler(context)) this.eventDropped(state.plan.route, verdict);
    if (verdict.source === 'closed') {
      const retryAfter = Math.max(1, Math.ceil(this.timeoutMs / 1000));
      this.headers.writeRetryAfter(response, retryAfter);
      if (state.kind !== 'http') throw refusalFor(context, retryAfter, 'RATE_LIMIT_UNAVAILABLE');
      throw new ServiceUnavailableException('Rate limiting is unavailable; try again shortly');
    }
    this.headers.write(response, state.policies, verdict);
    if (verdict.source === 'blocked' && this.blockedStatus === 403 && state.kind === 'http') {
      throw new ForbiddenException('Blocked by the operator; try again later');
    }
    return state.hooks.throwRateLimitException(context, verdict);
  }

  /** An event has no reply to carry its refusal: said here (at most every 10 s per handler), then dropped. */
  private eventDropped(route: string, verdict: Verdict): void {
    let logger = this.dropLoggers.get(route);
    if (logger === undefined) this.dropLoggers.set(route, (logger = new ThrottledLogger('RateLimit')));
    logger.warn(
      verdict.source === 'closed'
        ? `Event of ${route} dropped: rate limiting is unavailable (failureMode 'closed')`
        : `Event of ${route} dropped: rate limited (retry after ${longestWait(verdict)} s)`,
    );
  }
}

type ErrorClass = new (error: object) => Error;

/**
 * `WsException` and `RpcException` from the app's own `@nestjs/websockets` / `@nestjs/microservices`:
 * Nest's filters recognise them with `instanceof`, and the library depends on neither package. Loaded
 * at start-up when the app has such handlers (`loadTransportErrors`).
 */
const loaded: { ws?: ErrorClass; rpc?: ErrorClass } = {};

export async function loadTransportErrors(kinds: ReadonlySet<'ws' | 'rpc'>): Promise<void> {
  if (kinds.has('ws') && loaded.ws === undefined) loaded.ws = (await importOptional(WEBSOCKETS)).WsException as ErrorClass;
  if (kinds.has('rpc') && loaded.rpc === undefined) loaded.rpc = (await importOptional(MICROSERVICES)).RpcException as ErrorClass;
}

// Names in variables: apps without these packages compile the library's sources without them.
const WEBSOCKETS: string = '@nestjs/websockets';
const MICROSERVICES: string = '@nestjs/microservices';

function importOptional(name: string): Promise<Record<string, unknown>> {
  return import(name) as Promise<Record<string, unknown>>;
}

/**
 * A refused microservice event, which has no reply: dropped. An `IntrinsicException`, so Nest drops it
 * without logging it as a fault (the limiter logs the drops, throttled, and reports them as decisions).
 */
export class RateLimitedEventDropped extends IntrinsicException {
  constructor(readonly retryAfter: number) {
    super('Event dropped: rate limited');
    this.name = 'RateLimitedEventDropped';
  }
}

/** Whether a microservice handler is an `@EventPattern` (Nest's `PatternHandler.EVENT`). */
export function isEventHandler(context: ExecutionContext): boolean {
  return Reflect.getMetadata('microservices:handler_type', context.getHandler()) === 2;
}

/**
 * The refusal each transport's client understands:
 * - HTTP: `RateLimitException` (429);
 * - GraphQL: `RateLimitedGraphQLError` (the field's error, `extensions.code`);
 * - WebSocket: `WsException` with a `RateLimitedPayload` (socket.io: the `exception` event; ws: an
 *   `exception` message); a socket.io acknowledgement the client waits for gets the payload too;
 * - microservice message: `RpcException` with the payload (the `ClientProxy` subscriber's error);
 * - microservice event: `RateLimitedEventDropped`.
 */
export function refusalFor(context: ExecutionContext, retryAfter: number, code: RateLimitedPayload['code']): Error {
  return withoutStack(() => refusal(context, retryAfter, code));
}

function refusal(context: ExecutionContext, retryAfter: number, code: RateLimitedPayload['code']): Error {
  const type = context.getType<string>();
  if (type === 'http') return new RateLimitException(retryAfter);
  if (type === 'graphql') return new RateLimitedGraphQLError(retryAfter, code);
  if (type === 'rpc' && isEventHandler(context)) return new RateLimitedEventDropped(retryAfter);
  const payload: RateLimitedPayload = {
    status: 'error',
    code,
    message: code === 'RATE_LIMITED' ? 'Too Many Requests' : 'Rate limiting is unavailable; try again shortly',
    retryAfter,
  };
  if (type === 'ws') {
    const ack = context.getArgs()[2];
    if (typeof ack === 'function') ack(payload);
  }
  const Class = type === 'ws' ? loaded.ws : type === 'rpc' ? loaded.rpc : undefined;
  // Loaded at start-up for every gateway and pattern handler the app has; an Error carrying the payload otherwise
  // (a refusal, with the payload's own code RATE_LIMITED / RATE_LIMIT_UNAVAILABLE: not a library error).
  return Class === undefined ? Object.assign(new Error(payload.message), payload) : new Class(payload);
}
