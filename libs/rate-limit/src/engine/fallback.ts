import type { FailureMode, ResolvedRateLimitOptions } from '../rate-limit.options.js';
import type { Verdict, VerdictSource } from '../rate-limit.interfaces.js';
import type { ReservationMark, ReserveOptions, TakeOptions } from '../stores/bucket-store.interface.js';
import { localStoreOptions, MemoryBucketStore } from '../stores/memory/memory-bucket.store.js';
import { type BucketRequest, toDecision } from '../stores/token-bucket.js';
import { toVerdict } from './to-verdict.js';

/** A reservation's answer (`DecisionEngine.reserve`): who decided, whether it is held, the bucket's tokens, and the wait until its turn. */
export interface Reservation {
  source: VerdictSource;
  /** Reserved (or, for `'open'`, let through); false: refused (`'closed'`, or a wait beyond the call's longest). */
  allowed: boolean;
  tokens: number;
  /** ms from the answer until the caller's turn (when refused: the wait it would have had). */
  waitMs: number;
  /** The turn by the clock of the store that decided (its now + `waitMs`), when it tells. */
  turnAt?: number;
  /** What its give-back names (the tokens it left, the store's clock), when the store tells its clock. */
  mark?: ReservationMark;
}

/** What a request gets while the store fails, per `failureMode`, for the log. */
const FAILURE_EFFECT: Record<FailureMode, string> = {
  open: 'requests are allowed without a limit',
  closed: 'requests are refused (503)',
  local: 'requests are limited by in-process buckets',
};

/** The verdicts `failureMode` gives while the store cannot decide, and the in-process buckets of `'local'`. */
export class Fallback {
  /** The buckets of `failureMode: 'local'`, emptied when the store answers again. */
  readonly local: MemoryBucketStore;
  /** Decisions `failureMode` made in the current outage, for the recovery log line. */
  private degraded = 0;
  /** Decisions `failureMode` made per second of the last minute: a ring of 60, each slot stamped with its second. */
  private readonly perSecond = new Array<number>(60).fill(0);
  private readonly seconds = new Array<number>(60).fill(-Infinity);

  constructor(private readonly options: ResolvedRateLimitOptions) {
    this.local = new MemoryBucketStore(localStoreOptions(options, "failureMode: 'local'"));
  }

  /** What requests get while the store fails, for the log. */
  get effect(): string {
    return FAILURE_EFFECT[this.options.failureMode];
  }

  /** The verdict `failureMode` gives while the store cannot decide. */
  decide(requests: readonly BucketRequest[], options: TakeOptions | undefined): Verdict {
    this.count();
    const source = this.options.failureMode;
    if (source === 'local') return toVerdict(requests, this.local.takeSync(requests, options), 'local');
    const allowed = source === 'open';
    return {
      allowed,
      source,
      decisions: requests.map((r) => toDecision(r, allowed ? r.capacity - r.cost : 0, r.cost, allowed)),
    };
  }

  /**
   * The reservation `mode` gives while the store cannot decide: `'open'` goes ahead at once (nothing
   * reserved), `'closed'` refuses, `'local'` reserves in the in-process bucket and waits for its turn there.
   */
  reserve(request: BucketRequest, reserve: ReserveOptions, mode: FailureMode): Reservation {
    this.count();
    if (mode === 'local') {
      const { allowed, tokens, waitMs = 0, nowMs } = this.local.takeSync([request], { reserve });
      return {
        source: 'local',
        allowed,
        tokens: tokens[0],
        waitMs,
        turnAt: nowMs === undefined ? undefined : nowMs + waitMs,
        mark: nowMs === undefined ? undefined : { tokens: tokens[0], nowMs },
      };
    }
    const allowed = mode === 'open';
    return { source: mode, allowed, tokens: allowed ? request.capacity - request.cost : 0, waitMs: 0 };
  }

  /**
   * The store answers again: its buckets are the truth again, and the outage's in-process ones would
   * be stale at the next outage. Answers how many decisions `failureMode` made meanwhile.
   */
  /** Decisions `failureMode` made in the last 60 seconds (whole seconds: up to one more second's worth). */
  lastMinute(): number {
    const second = Math.floor(Date.now() / 1000);
    let decisions = 0;
    for (let i = 0; i < 60; i++) if (second - this.seconds[i] < 60) decisions += this.perSecond[i];
    return decisions;
  }

  count(): void {
    this.degraded++;
    const second = Math.floor(Date.now() / 1000);
    const slot = second % 60;
    if (this.seconds[slot] !== second) {
      this.seconds[slot] = second;
      this.perSecond[slot] = 0;
    }
    this.perSecond[slot]++;
  }

  recovered(): number {
    this.local.clear();
    const degraded = this.degraded;
    this.degraded = 0;
    return degraded;
  }
}
