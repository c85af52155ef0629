import { DecisionCounts, RESTORE_SECONDS } from '../../../libs/rate-limit/src/operations/analytics/decision-counts.js';

/** A clock the test moves by hand (epoch ms). */
function fakeClock(start: number): { now: () => number; at: (ms: number) => void } {
  let ms = start;
  return { now: () => ms, at: (next) => (ms = next) };
}

const T0 = 1_800_000_000_000; // an epoch second boundary

describe('DecisionCounts: decisions per scope and identity, counted in memory between two flushes', () => {
  it('hands over exact totals per second and the top identities per scope, then starts afresh', () => {
    const clock = fakeClock(T0);
    const counts = new DecisionCounts(10, 100, clock.now);
    counts.record('login', 'ip:10.0.0.1', true);
    counts.record('login', 'ip:10.0.0.1', false);
    counts.record('login', 'ip:10.0.0.2', false);
    clock.at(T0 + 1500);
    counts.record('login', 'ip:10.0.0.2', false);
    counts.record('search', 'user:42', true);

    const snapshot = counts.take();
    expect(snapshot).toEqual({
      scopes: [
        {
          scope: 'login',
          seconds: [
            { at: T0 / 1000, allowed: 1, refused: 2 },
            { at: T0 / 1000 + 1, allowed: 0, refused: 1 },
          ],
          allowed: [{ id: 'ip:10.0.0.1', count: 1, error: 0 }],
          refused: [
            { id: 'ip:10.0.0.2', count: 2, error: 0 },
            { id: 'ip:10.0.0.1', count: 1, error: 0 },
          ],
        },
        {
          scope: 'search',
          seconds: [{ at: T0 / 1000 + 1, allowed: 1, refused: 0 }],
          allowed: [{ id: 'user:42', count: 1, error: 0 }],
          refused: [],
        },
      ],
    });
    expect(counts.take()).toBeUndefined(); // an idle instance sends nothing

    counts.record('search', 'user:42', false); // the same second as before the take: counted once, in the next snapshot
    expect(counts.take()?.scopes).toEqual([
      {
        scope: 'search',
        seconds: [{ at: T0 / 1000 + 1, allowed: 0, refused: 1 }],
        allowed: [],
        refused: [{ id: 'user:42', count: 1, error: 0 }],
      },
    ]);
  });

  it('adds a failed flush back into the next snapshot: totals summed per second, identities summed', () => {
    const clock = fakeClock(T0);
    const counts = new DecisionCounts(10, 100, clock.now);
    counts.record('login', 'ip:10.0.0.1', false);
    counts.record('login', 'ip:10.0.0.1', false);
    const failed = counts.take();
    if (failed === undefined) throw new Error('expected a snapshot');
    counts.record('login', 'ip:10.0.0.1', false);
    clock.at(T0 + 1000);
    counts.record('login', 'ip:10.0.0.3', true);
    counts.restore(failed);

    expect(counts.take()?.scopes).toEqual([
      {
        scope: 'login',
        seconds: [
          { at: T0 / 1000, allowed: 0, refused: 3 },
          { at: T0 / 1000 + 1, allowed: 1, refused: 0 },
        ],
        allowed: [{ id: 'ip:10.0.0.3', count: 1, error: 0 }],
        refused: [{ id: 'ip:10.0.0.1', count: 3, error: 0 }],
      },
    ]);
  });

  it('stays bounded across failed flushes: K identities per sketch, seconds older than RESTORE_SECONDS dropped', () => {
    const clock = fakeClock(T0);
    const counts = new DecisionCounts(10, 100, clock.now);
    let pending = undefined as ReturnType<DecisionCounts['take']>;
    for (let second = 0; second < RESTORE_SECONDS + 100; second++) {
      clock.at(T0 + second * 1000);
      for (let i = 0; i < 5; i++) counts.record('login', `ip:10.0.${second & 255}.${i}`, false);
      const snapshot = counts.take();
      if (pending !== undefined) counts.restore(pending);
      pending = snapshot; // every flush fails: what was taken is always handed back
    }
    if (pending !== undefined) counts.restore(pending);
    const last = counts.take();
    const login = last?.scopes[0];
    expect(login?.refused).toHaveLength(10);
    expect(login?.seconds.length).toBeLessThanOrEqual(RESTORE_SECONDS + 1);
    expect(login?.seconds[0].at).toBeGreaterThanOrEqual(T0 / 1000 + 100 - 1);
    expect(login?.seconds.every((point) => point.refused === 5)).toBe(true);
    expect(login?.refused.reduce((sum, entry) => sum + entry.count, 0)).toBeGreaterThan(0);
  });

  it('counts at most maxScopes scopes, and says how many decisions it dropped', () => {
    const counts = new DecisionCounts(10, 2);
    counts.record('a', 'ip:1.1.1.1', true);
    counts.record('b', 'ip:1.1.1.1', true);
    counts.record('c', 'ip:1.1.1.1', true);
    counts.record('c', 'ip:1.1.1.1', false);
    expect(counts.take()?.scopes.map((scope) => scope.scope)).toEqual(['a', 'b']);
    expect(counts.dropped).toBe(2);
  });

  it('keeps the top K per scope whatever the number of identities (100,000 distinct)', () => {
    const counts = new DecisionCounts(50);
    for (let i = 0; i < 100_000; i++) counts.record('login', `ip:10.${i >> 16}.${(i >> 8) & 255}.${i & 255}`, i % 3 !== 0);
    counts.record('login', 'ip:203.0.113.7', false);
    for (let i = 0; i < 5000; i++) counts.record('login', 'ip:203.0.113.7', false); // a heavy hitter: > N/K
    const login = counts.take()?.scopes[0];
    expect(login?.allowed).toHaveLength(50);
    expect(login?.refused).toHaveLength(50);
    expect(login?.refused[0].id).toBe('ip:203.0.113.7');
    const seconds = login?.seconds ?? [];
    expect(seconds.reduce((sum, point) => sum + point.allowed + point.refused, 0)).toBe(105_001);
  });
});
