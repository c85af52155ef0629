import fc from 'fast-check';
import { SpaceSaving } from '../../../libs/rate-limit/src/operations/analytics/space-saving.js';

/** A stream: items drawn from a skewed distribution (a few heavy, many light), with a count per addition. */
const streamArb = (maxN: number) =>
  fc.array(
    fc.tuple(
      fc.oneof({ weight: 3, arbitrary: fc.integer({ min: 0, max: 4 }) }, { weight: 2, arbitrary: fc.integer({ min: 5, max: 500 }) }),
      fc.integer({ min: 1, max: maxN }),
    ),
    { maxLength: 400 },
  );

function exact(stream: [number, number][]): Map<string, number> {
  const counts = new Map<string, number>();
  for (const [item, n] of stream) counts.set(`id:${item}`, (counts.get(`id:${item}`) ?? 0) + n);
  return counts;
}

/** Checks Space-Saving's guarantees of `sketch` against the exact counts of `stream`. */
function checkGuarantees(sketch: SpaceSaving, stream: [number, number][], k: number): void {
  const truth = exact(stream);
  const total = stream.reduce((sum, [, n]) => sum + n, 0);
  const entries = sketch.entries();
  const held = new Map(entries.map((entry) => [entry.id, entry]));
  expect(sketch.total).toBe(total);
  expect(entries.length).toBe(Math.min(k, truth.size));
  expect(entries.reduce((sum, entry) => sum + entry.count, 0)).toBe(total);
  for (let i = 1; i < entries.length; i++) expect(entries[i - 1].count).toBeGreaterThanOrEqual(entries[i].count);
  for (const entry of entries) {
    const real = truth.get(entry.id) ?? 0;
    expect(entry.count - entry.error).toBeLessThanOrEqual(real);
    expect(entry.count).toBeGreaterThanOrEqual(real);
    expect(entry.error).toBeLessThanOrEqual(total / k);
  }
  for (const [id, real] of truth) if (real > total / k) expect(held.has(id)).toBe(true);
}

describe('SpaceSaving: the heavy hitters of a stream in K counters', () => {
  it('keeps every item seen more than N/K times, with its true count within [count - error, count] and error <= N/K (additions of 1)', () => {
    fc.assert(
      fc.property(fc.integer({ min: 1, max: 40 }), streamArb(1), (k, stream) => {
        const sketch = new SpaceSaving(k);
        for (const [item] of stream) sketch.add(`id:${item}`);
        checkGuarantees(sketch, stream, k);
      }),
      { numRuns: 300 },
    );
  });

  it('keeps the same guarantees when counts of more than 1 are added (merging a failed flush back)', () => {
    fc.assert(
      fc.property(fc.integer({ min: 1, max: 40 }), streamArb(50), (k, stream) => {
        const sketch = new SpaceSaving(k);
        for (const [item, n] of stream) sketch.add(`id:${item}`, n);
        checkGuarantees(sketch, stream, k);
      }),
      { numRuns: 300 },
    );
  });

  it('is exact while there are at most K distinct items, and empty after clear()', () => {
    const sketch = new SpaceSaving(3);
    for (const id of ['a', 'b', 'a', 'c', 'a', 'b']) sketch.add(id);
    sketch.add('c', 5);
    expect(sketch.entries()).toEqual([
      { id: 'c', count: 6, error: 0 },
      { id: 'a', count: 3, error: 0 },
      { id: 'b', count: 2, error: 0 },
    ]);
    sketch.add('d');
    expect(sketch.entries()).toEqual([
      { id: 'c', count: 6, error: 0 },
      { id: 'a', count: 3, error: 0 },
      { id: 'd', count: 3, error: 2 },
    ]);
    sketch.clear();
    expect(sketch.entries()).toEqual([]);
    expect(sketch.total).toBe(0);
    sketch.add('e');
    expect(sketch.entries()).toEqual([{ id: 'e', count: 1, error: 0 }]);
  });

  it('holds K counters at most after 100,000 distinct items', () => {
    const sketch = new SpaceSaving(100);
    for (let i = 0; i < 100_000; i++) sketch.add(`ip:10.0.${i >> 8}.${i & 255}`);
    expect(sketch.size).toBe(100);
    expect(sketch.entries()).toHaveLength(100);
  });

  it('refuses a capacity that is not an integer >= 1', () => {
    expect(() => new SpaceSaving(0)).toThrow('SpaceSaving capacity must be an integer >= 1 (got 0)');
  });
});
