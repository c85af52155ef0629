/** What one process of the queue-bound tests does (queue-child.ts reads it from argv as JSON). */
export interface Plan {
  capacity: number;
  refillPerSecond: number;
  /** The module's acquire.maxWaitMs (this instance's: instances of a rolling deploy may differ). */
  maxWaitMs: number;
  /** Calls of acquire() at once, at the go. */
  count: number;
  /** Every abortEvery-th call (from the second) gets a signal, aborted within abortWithinMs. */
  abortEvery?: number;
  abortWithinMs?: number;
  /** More calls, laterAfterMs after the go. */
  later?: number;
  laterAfterMs?: number;
  /** The application closes this long after the go. */
  closeAfterMs?: number;
}

/** What it prints: the turns (Redis' clock) of the calls granted, and how the others ended. */
export interface QueueChildResult {
  granted: number[];
  aborted: number;
  closed: number;
  tooLong: number;
  refused: number;
}
