import { connect, createServer, type Socket } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { RateLimitTimeoutError } from 'nest-redis-rate-limit';
import { LOOP_LIMIT_MS, watchLoopDelay } from '../../support/loop-delay.js';
import { Deadlines, withTimeout } from '../../../libs/rate-limit/src/engine/with-timeout.js';

const never = () => new Promise<never>(() => undefined);

/** The two ends of a loopback TCP connection. */
async function socketPair(): Promise<{ near: Socket; far: Socket; close: () => void }> {
  const server = createServer();
  const accepted = new Promise<Socket>((resolve) => server.once('connection', resolve));
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as { port: number };
  const near = connect(port, '127.0.0.1');
  await new Promise<void>((resolve) => near.once('connect', () => resolve()));
  const far = await accepted;
  return { near, far, close: () => (near.destroy(), far.destroy(), server.close()) };
}

/** The next bytes `socket` reads: a line starting with `-` rejects, like a Redis error reply. */
const reply = (socket: Socket) =>
  new Promise<string>((resolve, reject) =>
    socket.once('data', (data) => {
      const text = data.toString();
      if (text.startsWith('-')) reject(new Error(text.slice(1)));
      else resolve(text);
    }),
  );

/** How a race ended, observed from the moment it starts (a rejection is never left unhandled). */
const outcome = (race: Promise<string>) =>
  race.then(
    (value) => `answered ${value}`,
    (error: Error) => (error instanceof RateLimitTimeoutError ? 'timed out' : `failed: ${error.message}`),
  );

/** Keeps the event loop busy (no timer, no I/O callback runs) for `ms`. */
function blockFor(ms: number): void {
  const until = performance.now() + ms;
  while (performance.now() < until) {
    // busy
  }
}

/**
 * Runs `arrange` in the check phase (a `setImmediate` callback), so that the loop's next steps are its
 * timers and then its poll for I/O: a reply written during `arrange` and a deadline that expires during
 * it are both due, and the timer comes first.
 */
const inCheckPhase = <T>(arrange: () => T) => new Promise<T>((resolve) => setImmediate(() => resolve(arrange())));

/**
 * Two hung races on a test's clock: a's deadline is 20 and b's 21; the timer fires at 20.5 (a is due, b
 * not yet), and by the time its expiry runs, after the poll phase, the clock reads 25: b's deadline has
 * passed as well.
 */
function twoDeadlinesAMomentApart(): { a: Promise<never>; b: Promise<never> } {
  let now = 0;
  const deadlines = new Deadlines(20, () => now);
  // Timers of one duration run in the order they were set: this one just before the module's, at 20.
  setTimeout(() => (now = 20.5), 20);
  const a = deadlines.race(never());
  now = 1;
  const b = deadlines.race(never());
  setTimeout(() => (now = 25), 20);
  return { a, b };
}

describe('Deadlines (one timer for every decision of a module)', () => {
  it('settles like the reply that reached the socket before the deadline, even when the loop reads it only after the deadline', async () => {
    const deadlines = new Deadlines(20);
    const ok = await socketPair();
    const down = await socketPair();
    try {
      const { answered, refused, hung } = await inCheckPhase(() => {
        const races = {
          answered: outcome(deadlines.race(reply(ok.near))),
          refused: outcome(deadlines.race(reply(down.near))),
          hung: outcome(deadlines.race(never())),
        };
        ok.far.write('pong');
        down.far.write('-down');
        // Past the deadline: when the loop turns, the timer and both replies are due together.
        blockFor(80);
        return races;
      });
      // The deadline had really passed: the race whose reply never came timed out in the same turn.
      expect([await answered, await refused, await hung]).toEqual(['answered pong', 'failed: down', 'timed out']);
    } finally {
      ok.close();
      down.close();
    }
  });

  it('rejects a promise that hangs with RateLimitTimeoutError after the timeout: not before, and at most 30 ms plus the loop delay after', async () => {
    // 100 ms: a race that waited twice as long can exceed 100 + 30 + LOOP_LIMIT_MS only.
    const deadlines = new Deadlines(100);
    const loop = watchLoopDelay();
    const loops: number[] = [];
    try {
      // A wait over which the loop stalled more than a quiet run's LOOP_LIMIT_MS says nothing about the
      // timer (a machine busy with other work): it is measured again, up to 5 times.
      for (let attempt = 0; attempt < 5; attempt++) {
        const startedAt = performance.now();
        await expect(deadlines.race(never())).rejects.toBeInstanceOf(RateLimitTimeoutError);
        const endedAt = performance.now();
        const loopMs = loop.over(startedAt, endedAt);
        expect(endedAt - startedAt).toBeGreaterThanOrEqual(99);
        expect(endedAt - startedAt - loopMs).toBeLessThanOrEqual(100 + 30);
        if (loopMs <= LOOP_LIMIT_MS) return;
        loops.push(loopMs);
      }
      throw new Error(
        `inconclusive: the loop stalled ${loops.map((ms) => ms.toFixed(0)).join(', ')} ms over 5 waits (at most ${LOOP_LIMIT_MS} needed)`,
      );
    } finally {
      loop.stop();
    }
  });

  it('times out each of many races at its own deadline while the answered ones resolve', async () => {
    const deadlines = new Deadlines(150);
    const outcomes: string[] = [];
    const races: Promise<void>[] = [];
    const soon = (value: number) => new Promise<number>((resolve) => setImmediate(resolve, value));
    for (let i = 0; i < 3000; i++) {
      const answer = i % 3 === 0 ? never() : soon(i);
      races.push(
        deadlines.race(answer).then(
          (v) => void outcomes.push(`ok ${v}`),
          () => void outcomes.push('timeout'),
        ),
      );
      if (i === 1500) await sleep(15);
    }
    const hung = deadlines.race(never());
    await Promise.all(races);
    expect(outcomes.filter((o) => o === 'timeout')).toHaveLength(1000);
    expect(outcomes.filter((o) => o.startsWith('ok'))).toHaveLength(2000);
    await expect(hung).rejects.toBeInstanceOf(RateLimitTimeoutError);
  });

  it('raceSent starts the clock at sent(): a call written after the loop was held 200 ms still gets its full 50 ms, a hung one times out 50 ms after its write', async () => {
    const deadlines = new Deadlines(50);
    const pair = await socketPair();
    try {
      let writtenAt = 0;
      let hungAt = 0;
      // Both asked for now, written only after the loop was held (as decisions that wait for the turn's end).
      const answered = outcome(
        deadlines.raceSent((sent) => {
          const answer = reply(pair.near);
          setImmediate(() => {
            blockFor(200);
            writtenAt = performance.now();
            sent();
            setTimeout(() => pair.far.write('pong'), 20);
          });
          return answer;
        }),
      );
      const hung = deadlines.raceSent((sent) => {
        setImmediate(() => {
          hungAt = performance.now();
          sent();
          sent(); // a second call changes nothing
        });
        return never();
      });
      const hungOutcome = hung.then(
        () => 'answered',
        () => performance.now() - hungAt,
      );
      expect(await answered).toBe('answered pong');
      expect(writtenAt).toBeGreaterThan(0);
      const waited = await hungOutcome;
      expect(typeof waited).toBe('number');
      expect(waited).toBeGreaterThanOrEqual(49);
      expect(waited).toBeLessThan(50 + 100);
    } finally {
      pair.close();
    }
  });

  it('declares a deadline that passed while the expiry waited for the poll at the next check phase, not after another timer', async () => {
    const { a, b } = twoDeadlinesAMomentApart();
    const order: string[] = [];
    const bEnded = b.catch((error: unknown) => void order.push(error instanceof RateLimitTimeoutError ? 'b timed out' : 'b failed'));
    await a.catch((error: unknown) => {
      order.push(error instanceof RateLimitTimeoutError ? 'a timed out' : 'a failed');
      // The next check phase: b is declared there, once pending I/O has been read once more (a reply
      // that came before its deadline would have won), without sleeping on a timer of 1 ms first.
      setImmediate(() => order.push('next check phase'));
    });
    await bEnded;
    await new Promise((resolve) => setImmediate(resolve));
    expect(order).toEqual(['a timed out', 'b timed out', 'next check phase']);
  });

  it('declares such a deadline at once in a process with nothing else to do (the expiry keeps the loop turning)', async () => {
    // As above, with nothing of the test's own pending when a has timed out: an expiry queued for the next
    // check phase but not holding the loop would let it sleep in its poll until some other timer or I/O
    // woke it (801 ms late in a run of this file), and b would wait for that.
    const { a, b } = twoDeadlinesAMomentApart();
    const aEnded = a.catch(() => performance.now());
    // Only this guard is left to wake the loop, 1 s on.
    let guardFired = false;
    const guard = setTimeout(() => (guardFired = true), 1_000);
    try {
      await expect(b).rejects.toBeInstanceOf(RateLimitTimeoutError);
      const bEndedAt = performance.now();
      expect(guardFired).toBe(false);
      expect(bEndedAt - (await aEnded)).toBeLessThan(100);
    } finally {
      clearTimeout(guard);
    }
  });

  it('raceSent never times out a call that settles before it is sent', async () => {
    const deadlines = new Deadlines(10);
    await expect(deadlines.raceSent(() => Promise.reject(new Error('not connected')))).rejects.toThrow('not connected');
    await expect(deadlines.raceSent(() => Promise.resolve(7))).resolves.toBe(7);
  });

  it('withTimeout lets a reply that reached the socket before the deadline win, though the loop reads it after the deadline', async () => {
    const pair = await socketPair();
    try {
      const { answered, hung } = await inCheckPhase(() => {
        const races = { answered: outcome(withTimeout(reply(pair.near), 20)), hung: outcome(withTimeout(never(), 20)) };
        pair.far.write('pong');
        blockFor(80);
        return races;
      });
      expect([await answered, await hung]).toEqual(['answered pong', 'timed out']);
    } finally {
      pair.close();
    }
  });
});
