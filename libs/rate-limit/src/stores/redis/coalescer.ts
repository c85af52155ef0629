import type { BucketRequest } from '../token-bucket.js';
import { hashTag, keySlot } from './cluster-slots.js';
import type { DecisionExtra, ScriptResult, TokenBucketMode } from './lua/script-codec.js';

/** At most this many decisions share one script call (a script holds Redis while it runs). */
export const MAX_DECISIONS_PER_CALL = 64;

/** A decision waiting for the end of the event-loop turn. */
export interface Queued {
  requests: readonly BucketRequest[];
  mode: TokenBucketMode;
  /** Starts the decision's deadline when its call is handed to the client. */
  sent: (() => void) | undefined;
  /** A reservation, or the give-back of one (a refund that names it). */
  extra: DecisionExtra | undefined;
  resolve: (result: ScriptResult) => void;
  reject: (error: unknown) => void;
}

/** One decision in a call of its own. */
type SendOne = (
  requests: readonly BucketRequest[],
  mode: TokenBucketMode,
  sent: (() => void) | undefined,
  extra: DecisionExtra | undefined,
) => Promise<ScriptResult>;
/** Decisions in one call, in order: per decision its result, or the script's refusal of its numbers. */
type SendMany = (decisions: readonly Queued[]) => Promise<(ScriptResult | Error)[]>;

/**
 * Decisions pending in the same event-loop turn share one script call. The first decision of a turn
 * (per Cluster slot) goes out at once, alone; the ones that arrive after it in the same turn wait only
 * for the turn to end (setImmediate, after the I/O callbacks of this turn) and then share one script
 * call, which decides each on its own, in order, atomically per decision. Nothing ever waits for more
 * decisions to come, so a lone request pays nothing, and each request still costs at most one round trip.
 *
 * `sent` is called when the decision's command is handed to the client: at once for a decision that
 * goes alone, at the end of the turn for one that waited. Its deadline runs from then (`Deadlines`).
 *
 * Reservations (`acquire()`) share calls too: a burst of them is a few calls, not one per caller, and
 * those of one bucket in a call are decided as one batch (the store reads and writes the bucket once).
 */
export class Coalescer {
  /** Per lane (Cluster slot, or 0): null once a decision went out alone this turn, then the ones queued after it. */
  private turn: Map<number, Queued[] | null> | undefined;

  constructor(
    private readonly sendOne: SendOne,
    private readonly sendMany: SendMany,
    /** A Cluster: decisions of different slots go to different nodes, so each slot is a lane of its own. */
    private readonly bySlot: boolean,
  ) {}

  run(
    requests: readonly BucketRequest[],
    mode: TokenBucketMode,
    sent: (() => void) | undefined,
    extra?: DecisionExtra,
  ): Promise<ScriptResult> {
    const lane = this.bySlot ? keySlot(hashTag(requests[0].key)) : 0;
    let turn = this.turn;
    if (turn === undefined) {
      turn = this.turn = new Map();
      setImmediate(this.endTurn);
    }
    const waiting = turn.get(lane);
    if (waiting === undefined) {
      turn.set(lane, null);
      return this.sendOne(requests, mode, sent, extra);
    }
    return new Promise<ScriptResult>((resolve, reject) => {
      const decision: Queued = { requests, mode, sent, extra, resolve, reject };
      if (waiting === null) turn.set(lane, [decision]);
      else waiting.push(decision);
    });
  }

  private readonly endTurn = (): void => {
    const turn = this.turn;
    this.turn = undefined;
    if (turn === undefined) return;
    for (const waiting of turn.values()) {
      if (waiting === null) continue;
      for (let i = 0; i < waiting.length; i += MAX_DECISIONS_PER_CALL) {
        this.sendQueued(waiting.length <= MAX_DECISIONS_PER_CALL ? waiting : waiting.slice(i, i + MAX_DECISIONS_PER_CALL));
      }
    }
  };

  /** Decisions that waited for the end of the turn: one call; each settles with its own result. */
  private sendQueued(queued: readonly Queued[]): void {
    if (queued.length === 1) {
      const [{ requests, mode, sent, extra, resolve, reject }] = queued;
      this.sendOne(requests, mode, sent, extra).then(resolve, reject);
      return;
    }
    this.sendMany(queued).then(
      (results) =>
        queued.forEach((decision, i) => {
          const result = results[i];
          if (result instanceof Error) decision.reject(result);
          else decision.resolve(result);
        }),
      (error: unknown) => queued.forEach((decision) => decision.reject(error)),
    );
  }
}
