import type { ExecutionContext } from '@nestjs/common';
import { Observable, type Subscription } from 'rxjs';
// From 'rxjs/operators': the 'rxjs' entry point exports operators only since 7.2, and the peer range starts at 7.1.
import { finalize } from 'rxjs/operators';
import type { BucketService } from '../bucket/bucket.service.js';
import type { ConcurrencySlot } from '../bucket/concurrency-slots.js';
import type { LimitedCall } from '../contexts/limited-call.js';
import type { RateLimitHeadersWriter } from '../headers/rate-limit-headers.writer.js';
import { routeKey } from '../keys/identity-keys.js';
import { RATE_LIMIT_VERDICT } from '../rate-limit.constants.js';
import type { CompiledConcurrency } from '../policies/concurrency-option.js';
import type { Verdict } from '../rate-limit.interfaces.js';
import type { ResolvedRateLimitOptions } from '../rate-limit.options.js';
import type { RateLimitEvents } from '../events/rate-limit-events.js';
import type { Identities } from './identity.js';
import type { Refunds } from './refunds.js';
import type { Refusals } from './refusals.js';
import type { RequestState } from './request-state.js';

/**
 * A route's `@ConcurrencyLimit`, in `RateLimitInterceptor` after the phase-2 policies allowed the request:
 * the slot is taken (one store call; waiting up to `maxWaitMs`), the handler runs in it, and the slot
 * is given back (one more) once the handler's stream has ended — completed, failed, or unsubscribed
 * (a timeout, an SSE client that left) — and, over HTTP, the response is closed (finished, or its
 * connection gone: a streamed file is still being sent after the handler returned). A refusal gives
 * back what the request's rate policies took, so a request is still all or nothing.
 */
export class RouteSlots {
  constructor(
    private readonly options: ResolvedRateLimitOptions,
    private readonly identities: Identities,
    private readonly buckets: BucketService,
    private readonly headers: RateLimitHeadersWriter,
    private readonly refusals: Refusals,
    private readonly refunds: Refunds,
    private readonly events: RateLimitEvents,
  ) {}

  /**
   * The handler's stream, in a slot. Phase 2 (`decide`) and the slot are decided when the stream is
   * subscribed to, and the subscription owns the slot: one that ends while they are pending (a timeout
   * interceptor around this one, a client gone while waiting) aborts the wait, and a slot granted after
   * that is given back at once, so no slot is ever held for a stream nobody reads. A slot phase 2 took
   * with its policies (`state.slotTaken`) is adopted; otherwise it is taken here, in a call of its own.
   */
  around(
    context: ExecutionContext,
    call: LimitedCall,
    limit: CompiledConcurrency,
    decide: () => Promise<void> | undefined,
    handle: () => Observable<unknown>,
  ): Observable<unknown> {
    return new Observable<unknown>((subscriber) => {
      const ended = new AbortController();
      let inner: Subscription | undefined;
      this.decideAndAdmit(context, call, limit, decide, ended.signal).then(
        (slot) => {
          if (slot !== undefined && ended.signal.aborted) return void slot.release();
          if (ended.signal.aborted) return;
          let stream: Observable<unknown>;
          try {
            if (slot !== undefined && slot.source !== 'open') {
              this.headers.writeConcurrency(call.response, slot.limit, slot.inFlight, undefined);
            }
            stream = handle();
          } catch (error) {
            void slot?.release();
            subscriber.error(error);
            return;
          }
          inner = (slot === undefined ? stream : this.held(stream, slot, nodeResponse(call))).subscribe(subscriber);
        },
        (error: unknown) => subscriber.error(error),
      );
      return () => {
        ended.abort(new Error('the request ended before its concurrency slot was taken'));
        inner?.unsubscribe();
      };
    });
  }

  /** Phase 2, then the slot (undefined: none, the request is exempt or allow-listed). A slot phase 2 took and its own failure then gives back. */
  private async decideAndAdmit(
    context: ExecutionContext,
    call: LimitedCall,
    limit: CompiledConcurrency,
    decide: () => Promise<void> | undefined,
    ended: AbortSignal,
  ): Promise<ConcurrencySlot | undefined> {
    try {
      await decide();
    } catch (error) {
      const state: RequestState | undefined = call.carrier[RATE_LIMIT_VERDICT];
      const taken = state?.slotTaken;
      if (taken !== undefined) {
        state!.slotTaken = undefined;
        await taken.slot.release();
      }
      throw error;
    }
    const state: RequestState | undefined = call.carrier[RATE_LIMIT_VERDICT];
    if (state === undefined || state.exempt === true) return undefined;
    return this.admit(context, call, state, limit, ended);
  }

  /**
   * Takes the slot of the request (undefined: its identity is allow-listed, no slot), waiting up to
   * `maxWaitMs` unless `ended` aborts or the client leaves, or adopts the one phase 2 took; reports the
   * decision; refuses by throwing.
   */
  private async admit(
    context: ExecutionContext,
    call: LimitedCall,
    state: RequestState,
    limit: CompiledConcurrency,
    ended: AbortSignal,
  ): Promise<ConcurrencySlot | undefined> {
    const taken = state.slotTaken;
    state.slotTaken = undefined;
    const slot = taken?.slot ?? (await this.take(context, call, state, limit, ended));
    if (slot === undefined) return undefined;
    if (this.events.decisionsWatched) {
      this.events.decision({
        route: state.plan.route,
        scope: limit.scope,
        outcome: slot.held ? 'allowed' : 'denied',
        source: slot.source,
        limit: slot.limit,
        remaining: Math.max(0, slot.limit - slot.inFlight),
        retryAfterSeconds: slot.retryAfterSeconds,
        context,
        limiter: 'concurrency',
      });
    }
    if (!slot.held) return this.refuse(context, call, state, slot, taken?.untaken === true);
    return slot;
  }

  /** The slot in a call of its own (undefined: the identity is allow-listed). */
  private async take(
    context: ExecutionContext,
    call: LimitedCall,
    state: RequestState,
    limit: CompiledConcurrency,
    ended: AbortSignal,
  ): Promise<ConcurrencySlot | undefined> {
    const found = this.identities.of(context, call.request, state.plan, limit, state.hooks);
    const who = 'then' in found ? await found : found;
    if (this.identities.allowListed(who)) return undefined;
    const raw = nodeResponse(call);
    const waiting = new AbortController();
    const stop = () => waiting.abort(new Error('the client closed the connection'));
    const gone = limit.maxWaitMs > 0 && raw !== undefined ? stop : undefined;
    if (gone !== undefined) raw!.once('close', gone);
    if (ended.aborted) stop();
    else ended.addEventListener('abort', stop, { once: true });
    try {
      return await this.buckets.slots.take({
        key: routeKey(this.options.keyPrefix, who.id, limit.keySuffix),
        scope: limit.scope,
        limit: limit.limit,
        leaseMs: limit.leaseMs,
        maxWaitMs: limit.maxWaitMs,
        signal: waiting.signal,
        failureMode: this.options.failureMode,
      });
    } catch (error) {
      // The client left while waiting (or the application is closing): nothing runs, so nothing is taken.
      await this.giveBackRate(state, false);
      throw error;
    } finally {
      if (gone !== undefined) raw!.removeListener('close', gone);
      ended.removeEventListener('abort', stop);
    }
  }

  /** `stream`, holding `slot` until it ends and (HTTP) the response has closed: two holds, the slot back when both are done. */
  private held(stream: Observable<unknown>, slot: ConcurrencySlot, raw: NodeResponse | undefined): Observable<unknown> {
    let holds = raw !== undefined && !closed(raw) ? 2 : 1;
    const done = () => {
      if (--holds === 0) void slot.release();
    };
    if (holds === 2) raw!.once('close', done);
    return stream.pipe(finalize(done));
  }

  /**
   * What the request's rate policies took goes back: a request refused for its slot takes nothing.
   * `untaken`: phase 2's buckets were left untouched (decided with the slot, which was refused).
   */
  private async giveBackRate(state: RequestState, untaken: boolean): Promise<void> {
    for (const take of [state.before?.enforced, untaken ? undefined : state.after?.enforced]) {
      if (take?.verdict.allowed) take.verdict = await this.refunds.giveBack(take);
    }
  }

  private async refuse(
    context: ExecutionContext,
    call: LimitedCall,
    state: RequestState,
    slot: ConcurrencySlot,
    untaken: boolean,
  ): Promise<never> {
    await this.giveBackRate(state, untaken);
    const wait = slot.retryAfterSeconds;
    const verdict: Verdict = {
      allowed: false,
      source: slot.source === 'closed' ? 'closed' : 'store',
      decisions: [{ allowed: false, limit: slot.limit, remaining: 0, retryAfterSeconds: wait, resetSeconds: wait }],
    };
    if (verdict.source === 'closed') return this.refusals.refuse(context, call.response, state, verdict);
    this.headers.writeConcurrency(call.response, slot.limit, slot.inFlight, wait);
    return state.hooks.throwRateLimitException(context, verdict);
  }
}

/** The Node response of an HTTP call (Express's `res`, Fastify's `reply.raw`), whose 'close' ends it; undefined for other transports. */
function nodeResponse(call: LimitedCall): NodeResponse | undefined {
  if (call.kind !== 'http') return undefined;
  const response = call.response?.raw ?? call.response;
  return typeof response?.once === 'function' && typeof response?.removeListener === 'function' ? response : undefined;
}

interface NodeResponse {
  once(event: 'close', listener: () => void): unknown;
  removeListener(event: 'close', listener: () => void): unknown;
  writableFinished?: boolean;
  destroyed?: boolean;
}

function closed(response: NodeResponse): boolean {
  return response.writableFinished === true || response.destroyed === true;
}
