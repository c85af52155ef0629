import type { ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { killChild } from '../../support/children.js';
import { RedisServer } from '../../support/redis.js';
import { buildChild, startChild, worstExcess } from '../../support/transpiled-child.js';
import type { Plan, QueueChildResult } from './queue-plan.js';

/**
 * Issue 32, items 1 and 4: B + R·t holds for acquire() in every window (by Redis' clock: each grant's
 * turn) when waits are aborted, when an instance closes or dies with reservations waiting, when callers of
 * one bucket have other refills (a rolling deploy). Each scenario is the failing case the issue measured,
 * scaled to seconds. A burst of 8,000 calls in one process is in acquire-burst.e2e-spec.ts.
 */
const CHILD = fileURLToPath(new URL('./queue-child.ts', import.meta.url));

let childEntry = '';

function startQueueChild(url: string, name: string, plan: Plan): Promise<{ child: ChildProcess; result: Promise<QueueChildResult> }> {
  return startChild<QueueChildResult>(childEntry, [url, name, JSON.stringify(plan)]);
}

describe('acquire() keeps B + R·t across processes (issue 32)', () => {
  let build: { entry: string; remove: () => Promise<void> } | undefined;
  let redis: RedisServer | undefined;
  const children: ChildProcess[] = [];

  beforeAll(async () => {
    [build, redis] = await Promise.all([buildChild(CHILD), RedisServer.start()]);
    childEntry = build.entry;
  }, 60_000);

  afterEach(async () => {
    await Promise.all(children.splice(0).map((child) => killChild(child)));
  });

  afterAll(async () => {
    await build?.remove();
    await redis?.stop();
  });

  it('aborted waits, a closing instance and a killed one never bunch the grants after them: B = 1, R = 80', async () => {
    const base = { capacity: 1, refillPerSecond: 80, maxWaitMs: 10_000 };
    // Three processes abort every other wait within 200 ms (the queue's first 0.8 s), then call 16 more
    // times; a fourth closes its application at 125 ms; a fifth is SIGKILLed at 125 ms with calls waiting.
    const aborting = { ...base, count: 16, abortEvery: 2, abortWithinMs: 200, later: 16, laterAfterMs: 225 };
    const started = await Promise.all([
      startQueueChild(redis!.url, 'aborts', aborting),
      startQueueChild(redis!.url, 'aborts', aborting),
      startQueueChild(redis!.url, 'aborts', aborting),
      startQueueChild(redis!.url, 'aborts', { ...base, count: 16, closeAfterMs: 125 }),
      startQueueChild(redis!.url, 'aborts', { ...base, count: 16 }),
    ]);
    children.push(...started.map(({ child }) => child));
    for (const { child } of started) child.stdin!.write('go\n');
    const killed = started[4];
    await new Promise((resolve) => setTimeout(resolve, 125));
    await killChild(killed.child);
    const results = await Promise.all(started.slice(0, 4).map(({ result }) => result));
    for (const result of results) expect(result.refused).toBe(0);
    // Each aborting process: 8 of its first 16 aborted (or granted, when the abort came after the turn), 16 later ones granted.
    for (const result of results.slice(0, 3)) {
      expect(result.granted.length + result.aborted).toBe(32);
      expect(result.aborted).toBeGreaterThan(0);
    }
    expect(results[3].closed).toBeGreaterThan(0);
    const turns = results.flatMap((r) => r.granted).sort((a, b) => a - b);
    // Turns are whole ms of Redis' clock, each at most 1 ms after its tokens existed: 1 + 80·(t + 1 ms).
    expect(worstExcess(turns, 1, 80)).toBeLessThanOrEqual(80 / 1000 + 1e-9);
  }, 60_000);

  it('callers with other refills on one bucket keep its queue: B = 5 at 40/s (maxWaitMs 1 s) and at 20/s (maxWaitMs 2.5 s)', async () => {
    // A rolling deploy: the new instance refills at 40/s and lets calls wait 1 s, the old one 20/s and 2.5 s.
    // The faster queues 40 calls (35 tokens below zero: 0.875 s at 40/s); 50 ms later the slower calls 10 times.
    const fast = await startQueueChild(redis!.url, 'mixed', { capacity: 5, refillPerSecond: 40, maxWaitMs: 1_000, count: 40 });
    const slow = await startQueueChild(redis!.url, 'mixed', { capacity: 5, refillPerSecond: 20, maxWaitMs: 2_500, count: 10 });
    children.push(fast.child, slow.child);
    fast.child.stdin!.write('go\n');
    await new Promise((resolve) => setTimeout(resolve, 50));
    slow.child.stdin!.write('go\n');
    const [a, b] = await Promise.all([fast.result, slow.result]);
    expect(a.granted).toHaveLength(40);
    // The slower instance read the queue as reservations (the depth stored in tokens, 41), not as damage
    // below the stored longest wait at its own refill (1 s at 20/s: 21 tokens): it queued behind the faster
    // one's last turn, at its own refill. Repairing the queue to 0 put its turns among the others'.
    expect(b.granted.length + b.tooLong).toBe(10);
    expect(b.granted.length).toBeGreaterThanOrEqual(5);
    expect(Math.min(...b.granted)).toBeGreaterThan(Math.max(...a.granted));
    const turns = [...a.granted, ...b.granted].sort((x, y) => x - y);
    expect(worstExcess(turns, 5, 40)).toBeLessThanOrEqual(40 / 1000 + 1e-9);
  }, 60_000);
});
