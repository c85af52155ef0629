import { setTimeout as sleep } from 'node:timers/promises';
import { Deadlines, RateLimitTimeoutError } from './with-timeout.js';

const never = () => new Promise<never>(() => undefined);

describe('Deadlines (one timer for every decision of a module)', () => {
  it('settles like the promise when it answers in time, and never rejects it later', async () => {
    const deadlines = new Deadlines(30);
    await expect(deadlines.race(Promise.resolve(7))).resolves.toBe(7);
    await expect(deadlines.race(Promise.reject(new Error('down')))).rejects.toThrow('down');
    await sleep(60);
  });

  it('rejects a promise that hangs with RateLimitTimeoutError after the timeout, not before', async () => {
    const deadlines = new Deadlines(40);
    const started = performance.now();
    await expect(deadlines.race(never())).rejects.toBeInstanceOf(RateLimitTimeoutError);
    expect(performance.now() - started).toBeGreaterThanOrEqual(39);
  });

  it('times out each of many races at its own deadline while the answered ones resolve', async () => {
    const deadlines = new Deadlines(150);
    const outcomes: string[] = [];
    const races: Promise<void>[] = [];
    const soon = (value: number) => new Promise<number>((resolve) => setImmediate(resolve, value));
    for (let i = 0; i < 3000; i++) {
      const answer = i % 3 === 0 ? never() : soon(i);
      races.push(deadlines.race(answer).then((v) => void outcomes.push(`ok ${v}`), () => void outcomes.push('timeout')));
      if (i === 1500) await sleep(15);
    }
    const hung = deadlines.race(never());
    await Promise.all(races);
    expect(outcomes.filter((o) => o === 'timeout')).toHaveLength(1000);
    expect(outcomes.filter((o) => o.startsWith('ok'))).toHaveLength(2000);
    await expect(hung).rejects.toBeInstanceOf(RateLimitTimeoutError);
  });

  it('lets a reply that arrived before the deadline was noticed win', async () => {
    const deadlines = new Deadlines(20);
    // The reply is ready in the same turn the timer fires: setImmediate lets it be read first.
    const reply = new Promise<string>((resolve) => setTimeout(() => resolve('read'), 20));
    await expect(deadlines.race(reply)).resolves.toBe('read');
  });
});
