/**
 * A bucket is hot on an instance once more than HOT_RUN decisions came there in a row, each within
 * HOT_GAP_MS of the one before; it stays hot while they come within COLD_GAP_MS of each other and its
 * averaged demand is at least COLD_DECISIONS_PER_SECOND. Below that, one call per decision costs Redis
 * little, and an identity that sends a request now and then never holds a lease. The count keeps a burst
 * exact: 64 requests at once are decided with the calls and headers of an exact bucket however fast or
 * slowly the app answers them (the 65th in a row is the first that can be leased), and a burst after a
 * pause starts a new run. The gaps, not a rate over fixed windows, tell a pause from a busy event loop.
 */
const HOT_RUN = 64;
const HOT_GAP_MS = 100;
const COLD_GAP_MS = 250;
const COLD_DECISIONS_PER_SECOND = 10;
/** How often the demand per second of a bucket is measured (ms). */
const RATE_WINDOW_MS = 100;

/** One bucket's demand on this instance (docs/explanation/leases.md, "Leased or exact"): whether it is hot, and its decisions per second. */
export class LeaseDemand {
  /** The decisions per second last measured (averaged with the measure before). */
  rate = 0;
  /** The decisions in a row, each close enough to the one before (HOT_GAP_MS, or COLD_GAP_MS once hot). */
  private run = 0;
  /** When the last decision came (performance.now()). */
  private last = -Infinity;
  /** Decisions since `since`, the start of the current window. */
  private hits = 0;
  private since: number;

  constructor(now: number) {
    this.since = now;
  }

  /** Hot long enough to lease the bucket. */
  get hot(): boolean {
    return this.run > HOT_RUN;
  }

  /** Counts a decision at `now` in its run, and measures the demand per second once a window has passed. */
  count(now: number): void {
    const gap = now - this.last;
    this.last = now;
    if (gap >= (this.hot ? COLD_GAP_MS : HOT_GAP_MS)) this.run = 0;
    this.run++;
    this.hits++;
    const elapsed = now - this.since;
    if (elapsed >= RATE_WINDOW_MS) {
      const rate = (this.hits * 1000) / elapsed;
      // A bucket idle for several windows starts from its new demand, not half its old one.
      this.rate = elapsed > 4 * RATE_WINDOW_MS ? rate : (this.rate + rate) / 2;
      if (this.rate < COLD_DECISIONS_PER_SECOND) this.run = 0;
      this.hits = 0;
      this.since = now;
    }
  }
}
