import type { ExecutionContext } from '@nestjs/common';
import type { VerdictSource } from '../rate-limit.interfaces.js';
import { ThrottledLogger } from '../throttled-logger.js';

/** What a policy's decision meant for the request. */
export type DecisionOutcome =
  /** The bucket had the tokens (or failureMode 'open' let the request through). */
  | 'allowed'
  /** The request was refused because of this policy (or another policy of the same atomic decision). */
  | 'denied'
  /** A shadow policy (`enforce: false`) would have refused; the request went on. */
  | 'shadow-denied';

/** One policy's decision for one request, as `onDecision` and the metrics see it. */
export interface RateLimitDecisionEvent {
  /** `Controller.handler`. */
  route: string;
  /** The policy's bucket scope: its `name`, or `Controller.handler` (`#i` for stacked unnamed policies; paths or version appended when classes share a name). Bounded: one per policy. */
  scope: string;
  outcome: DecisionOutcome;
  /** How it was decided: the store, the deny cache, or `failureMode`. */
  source: VerdictSource;
  /** The numbers the headers would carry. */
  limit: number;
  remaining: number;
  retryAfterSeconds: number;
  /** The request (for logging who it was). Never put identities in metric attributes: they are unbounded. */
  context: ExecutionContext;
  /**
   * `'concurrency'`: the decision of a route's `@ConcurrencyLimit` slot (`limit` is its limit, `remaining`
   * the slots left after it, `retryAfterSeconds` a hint). Absent: a rate policy's decision.
   */
  limiter?: 'concurrency';
}

/** One call to the store, for the latency histogram: `ok`, or it failed or timed out (`error`). */
export interface StoreCallEvent {
  durationMs: number;
  outcome: 'ok' | 'error';
}

type Listener<T> = (event: T) => void;

/**
 * Where decisions and store calls are reported: the module's `onDecision` option and the metrics listen
 * here. Emitting costs nothing while nobody listens (`decisionsWatched` / `storeWatched` are checked first).
 * A listener that throws is logged (at most every few seconds) and never breaks a request.
 */
export class RateLimitEvents {
  private readonly logger = new ThrottledLogger('RateLimit');
  private readonly decisionListeners: Listener<RateLimitDecisionEvent>[] = [];
  private readonly storeListeners: Listener<StoreCallEvent>[] = [];
  /** Someone listens to decisions: build the events. */
  decisionsWatched = false;
  /** Someone listens to store calls: time them. */
  storeWatched = false;

  onDecision(listener: Listener<RateLimitDecisionEvent>): void {
    this.decisionListeners.push(listener);
    this.decisionsWatched = true;
  }

  onStoreCall(listener: Listener<StoreCallEvent>): void {
    this.storeListeners.push(listener);
    this.storeWatched = true;
  }

  decision(event: RateLimitDecisionEvent): void {
    for (const listener of this.decisionListeners) this.call(listener, event);
  }

  storeCall(event: StoreCallEvent): void {
    for (const listener of this.storeListeners) this.call(listener, event);
  }

  private call<T>(listener: Listener<T>, event: T): void {
    try {
      listener(event);
    } catch (error) {
      this.logger.warn(`A rate-limit decision listener threw: ${error instanceof Error ? error.message : String(error)}`);
    }
  }
}
