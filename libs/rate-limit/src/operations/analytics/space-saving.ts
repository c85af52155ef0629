/**
 * Space-Saving (Metwally, Agrawal and El Abbadi, "Efficient computation of frequent and top-k elements
 * in data streams", 2005): the heavy hitters of a stream in K counters, whatever the number of distinct
 * items.
 *
 * Guarantees, after N additions (the sum of every `n`), for K counters:
 * - an item seen more than N / K times holds a counter;
 * - a held counter's `count` over-estimates the item's true count by at most its `error`, and
 *   `error` <= N / K: the true count lies in [count - error, count];
 * - the sum of the counts is N.
 *
 * The counters live in a stream summary: buckets of counters with one count each, in a doubly linked
 * list ordered by count, and a Map from item to counter. An addition of 1 moves the counter to the next
 * bucket (or renames the lowest counter, for an item not held while full): O(1), never a scan of the K
 * counters. An addition of n > 1 (merging counts back after a failed flush) walks past the buckets it
 * overtakes. Buckets and counters are reused, so a steady stream allocates nothing once full.
 */

/** One item's counter as `entries()` gives it. */
export interface SketchEntry {
  id: string;
  /** Over-estimate of the item's count: the true count is in [count - error, count]. */
  count: number;
  /** How much of `count` may belong to items this counter held before (0: exact). */
  error: number;
}

interface Bucket {
  count: number;
  /** Lower count. */
  prev: Bucket | null;
  /** Higher count. */
  next: Bucket | null;
  /** One of its counters (they form a circular list through `Counter.after`). */
  first: Counter | null;
}

interface Counter {
  id: string;
  error: number;
  bucket: Bucket;
  before: Counter;
  after: Counter;
}

export class SpaceSaving {
  private readonly counters = new Map<string, Counter>();
  /** The bucket with the lowest count (the next to lose a counter when full). */
  private lowest: Bucket | null = null;
  /** The bucket with the highest count. */
  private highest: Bucket | null = null;
  /** Buckets emptied and kept for reuse (at most K). */
  private spare: Bucket | null = null;
  private added = 0;

  /** @param capacity K, the number of counters (an integer >= 1). */
  constructor(readonly capacity: number) {
    if (!Number.isSafeInteger(capacity) || capacity < 1)
      throw new RangeError(`SpaceSaving capacity must be an integer >= 1 (got ${capacity})`);
  }

  /** N: the sum of every `n` added since the last clear. */
  get total(): number {
    return this.added;
  }

  /** How many counters are held (at most K). */
  get size(): number {
    return this.counters.size;
  }

  /** Counts `n` (a positive integer) more occurrences of `id`. */
  add(id: string, n = 1): void {
    this.added += n;
    const held = this.counters.get(id);
    if (held !== undefined) {
      this.raise(held, n);
      return;
    }
    if (this.counters.size < this.capacity) {
      const counter = { id, error: 0 } as Counter;
      this.counters.set(id, counter);
      this.place(counter, this.bucketFrom(null, n));
      return;
    }
    // Full: the lowest counter is handed over to `id`, its count becoming `id`'s error.
    const lowest = this.lowest as Bucket;
    const victim = lowest.first as Counter;
    this.counters.delete(victim.id);
    victim.id = id;
    victim.error = lowest.count;
    this.counters.set(id, victim);
    this.raise(victim, n);
  }

  /** The counters, highest count first. */
  entries(): SketchEntry[] {
    const out: SketchEntry[] = [];
    for (let bucket = this.highest; bucket !== null; bucket = bucket.prev) {
      const first = bucket.first as Counter;
      let counter = first;
      do {
        out.push({ id: counter.id, count: bucket.count, error: counter.error });
        counter = counter.after;
      } while (counter !== first);
    }
    return out;
  }

  /** Forgets every counter. */
  clear(): void {
    this.counters.clear();
    this.lowest = this.highest = this.spare = null;
    this.added = 0;
  }

  /** Moves `counter` from its bucket to the one of count + n. */
  private raise(counter: Counter, n: number): void {
    const from = counter.bucket;
    const target = from.count + n;
    // Alone in its bucket and no bucket in the way: the bucket itself takes the new count.
    if (counter.after === counter && (from.next === null || from.next.count > target)) {
      from.count = target;
      return;
    }
    this.unplace(counter);
    const stillThere = from.first !== null;
    const anchor = stillThere ? from : from.prev;
    if (!stillThere) this.unlink(from);
    this.place(counter, this.bucketFrom(anchor, target));
  }

  /**
   * The bucket of count `count`, found walking up from `anchor` (the lowest bucket when null), made
   * and linked in when missing. O(1) when `count` is at most the next bucket's count.
   */
  private bucketFrom(anchor: Bucket | null, count: number): Bucket {
    let below = anchor;
    let above = anchor === null ? this.lowest : anchor.next;
    while (above !== null && above.count < count) {
      below = above;
      above = above.next;
    }
    if (above !== null && above.count === count) return above;
    const bucket = this.newBucket(count);
    bucket.prev = below;
    bucket.next = above;
    if (below === null) this.lowest = bucket;
    else below.next = bucket;
    if (above === null) this.highest = bucket;
    else above.prev = bucket;
    return bucket;
  }

  private newBucket(count: number): Bucket {
    const reused = this.spare;
    if (reused === null) return { count, prev: null, next: null, first: null };
    this.spare = reused.next;
    reused.count = count;
    return reused;
  }

  /** Takes an empty bucket out of the list and keeps it for reuse. */
  private unlink(bucket: Bucket): void {
    if (bucket.prev === null) this.lowest = bucket.next;
    else bucket.prev.next = bucket.next;
    if (bucket.next === null) this.highest = bucket.prev;
    else bucket.next.prev = bucket.prev;
    bucket.prev = null;
    bucket.next = this.spare;
    this.spare = bucket;
  }

  private place(counter: Counter, bucket: Bucket): void {
    counter.bucket = bucket;
    const first = bucket.first;
    if (first === null) {
      counter.before = counter.after = counter;
      bucket.first = counter;
      return;
    }
    counter.after = first;
    counter.before = first.before;
    first.before.after = counter;
    first.before = counter;
  }

  /** Takes `counter` out of its bucket's ring (the bucket stays linked, possibly empty). */
  private unplace(counter: Counter): void {
    const bucket = counter.bucket;
    if (counter.after === counter) {
      bucket.first = null;
      return;
    }
    counter.before.after = counter.after;
    counter.after.before = counter.before;
    if (bucket.first === counter) bucket.first = counter.after;
  }
}
