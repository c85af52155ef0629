import { Test, type TestingModule } from '@nestjs/testing';
import { BucketService, BucketStore, RateLimitConcurrencyError, RateLimitModule, type RedisBucketStore } from 'nest-redis-rate-limit';
import { redisUrl } from '../../support/redis.js';
import { redisScenario } from '../../support/scenario.js';

/**
 * BucketService's concurrency slots (issue 36, item 3): takeSlot() with release() or `await using`,
 * withSlot() around a piece of work, waits that end by a handover or an AbortSignal, the end of the
 * application, and options checked as strictly as a route's.
 */
describe('BucketService concurrency slots', () => {
  const scenario = redisScenario('slot-service');
  let moduleRef: TestingModule | undefined;
  let buckets: BucketService;
  let prefix: string;

  async function open(store: 'redis' | 'memory' = 'redis'): Promise<void> {
    prefix = scenario.nextKeyPrefix();
    moduleRef = await Test.createTestingModule({
      imports: [RateLimitModule.forRoot(store === 'redis' ? { redis: await redisUrl(), keyPrefix: prefix } : { store: 'memory' })],
    }).compile();
    moduleRef.useLogger(false);
    await moduleRef.init();
    buckets = moduleRef.get(BucketService);
  }

  afterEach(async () => {
    await moduleRef?.close();
    moduleRef = undefined;
  });

  /** The slots Redis holds for `name`: the hash's fields (empty once the key is gone). */
  async function slotsOf(name: string): Promise<Record<string, string>> {
    return scenario.client.hgetall(`${prefix}{${name}}!`);
  }

  it('holds up to the limit, refuses one more, frees a slot on release() once only, and leaves no key when all are back', async () => {
    await open();
    const a = await buckets.takeSlot('export', { limit: 2 });
    const b = await buckets.takeSlot('export', { limit: 2 });
    expect([a.held, a.inFlight, b.held, b.inFlight, b.source]).toEqual([true, 1, true, 2, 'store']);
    const c = await buckets.takeSlot('export', { limit: 2 });
    expect([c.held, c.inFlight, c.source]).toEqual([false, 2, 'store']);
    expect(c.retryAfterSeconds).toBeGreaterThanOrEqual(1);
    expect(Object.keys(await slotsOf('export')).filter((field) => field.startsWith('s:'))).toHaveLength(2);
    await a.release();
    await a.release();
    await c.release();
    // The second release of a, and c's (never held), freed nothing: b still counts.
    expect((await slotsOf('export')).n).toBe('1');
    const d = await buckets.takeSlot('export', { limit: 2 });
    expect([d.held, d.inFlight]).toEqual([true, 2]);
    await b.release();
    await d.release();
    expect(await slotsOf('export')).toEqual({});
  });

  it('gives a slot back at the end of an `await using` block, and withSlot() however its work ends', async () => {
    await open();
    {
      await using slot = await buckets.takeSlot('scoped', { limit: 1 });
      expect(slot.held).toBe(true);
      expect((await slotsOf('scoped')).n).toBe('1');
    }
    expect(await slotsOf('scoped')).toEqual({});
    expect(await buckets.withSlot('scoped', { limit: 1 }, async () => (await slotsOf('scoped')).n)).toBe('1');
    await expect(buckets.withSlot('scoped', { limit: 1 }, () => Promise.reject(new Error('work failed')))).rejects.toThrow('work failed');
    expect(await slotsOf('scoped')).toEqual({});
    // Refused: the work never runs, and the error says why.
    const held = await buckets.takeSlot('scoped', { limit: 1 });
    let ran = false;
    const refused = await buckets
      .withSlot('scoped', { limit: 1 }, () => {
        ran = true;
      })
      .catch((error: unknown) => error);
    expect(refused).toBeInstanceOf(RateLimitConcurrencyError);
    expect(refused).toMatchObject({ code: 'ERR_RATE_LIMIT_CONCURRENCY_LIMITED', limit: 1, inFlight: 1 });
    expect(ran).toBe(false);
    await held.release();
  });

  it('waits up to maxWaitMs: a release on this instance hands the slot to the first waiter without a store call', async () => {
    await open();
    const first = await buckets.takeSlot('queue', { limit: 1 });
    const order: string[] = [];
    const waiting = ['w1', 'w2'].map((name) =>
      buckets.takeSlot('queue', { limit: 1, maxWaitMs: 3_000 }).then((slot) => {
        order.push(name);
        return slot;
      }),
    );
    await new Promise((resolve) => setTimeout(resolve, 60));
    const slotField = (slots: Record<string, string>) => Object.entries(slots).find(([field]) => field.startsWith('s:'));
    const before = slotField(await slotsOf('queue'));
    await first.release();
    const w1 = await waiting[0];
    expect([w1.held, w1.inFlight]).toEqual([true, 1]);
    // Handed over: the same slot in Redis with the same lease end: no call gave it back, took or renewed it.
    expect(slotField(await slotsOf('queue'))).toEqual(before);
    await w1.release();
    const w2 = await waiting[1];
    expect(order).toEqual(['w1', 'w2']);
    await w2.release();
    expect(await slotsOf('queue')).toEqual({});
    // Nobody gives one back: refused once maxWaitMs has passed, not before.
    const blocker = await buckets.takeSlot('queue', { limit: 1 });
    const started = performance.now();
    const late = await buckets.takeSlot('queue', { limit: 1, maxWaitMs: 300 });
    expect(late.held).toBe(false);
    expect(performance.now() - started).toBeGreaterThanOrEqual(290);
    await blocker.release();
  });

  it('ends a wait when its signal aborts, and every wait and slot when the application closes', async () => {
    await open();
    const held = await buckets.takeSlot('abort', { limit: 1 });
    const controller = new AbortController();
    const wait = buckets.takeSlot('abort', { limit: 1, maxWaitMs: 5_000, signal: controller.signal });
    setTimeout(() => controller.abort(new Error('caller gave up')), 50);
    await expect(wait).rejects.toMatchObject({ name: 'AbortError', cause: new Error('caller gave up') });
    expect((await slotsOf('abort')).n).toBe('1');
    // Aborted while its first take is on its way to Redis: it ends then, not after polling for maxWaitMs.
    const early = new AbortController();
    const started = performance.now();
    const asked = buckets.takeSlot('abort', { limit: 1, maxWaitMs: 3_000, signal: early.signal });
    early.abort(new Error('at once'));
    await expect(asked).rejects.toMatchObject({ name: 'AbortError', cause: new Error('at once') });
    expect(performance.now() - started).toBeLessThan(1_000);
    const closing = buckets.takeSlot('abort', { limit: 1, maxWaitMs: 5_000 });
    await new Promise((resolve) => setTimeout(resolve, 50));
    // Takes sent from here on: a waiter woken by the close must not ask again (a slot it got then would
    // be given back over a connection that is closing, and stay held until its lease ends).
    const store = moduleRef!.get<RedisBucketStore>(BucketStore);
    const takeSlot = store.takeSlot.bind(store);
    let takesDuringClose = 0;
    store.takeSlot = (...args) => {
      takesDuringClose++;
      return takeSlot(...args);
    };
    await moduleRef!.close();
    moduleRef = undefined;
    await expect(closing).rejects.toMatchObject({ code: 'ERR_RATE_LIMIT_SHUTTING_DOWN' });
    expect(takesDuringClose).toBe(0);
    // The held slot went back with the application.
    expect(await slotsOf('abort')).toEqual({});
    void held;
  });

  it('checks its options as strictly as a route: a clear error, nothing taken', async () => {
    await open();
    const calls: [unknown, RegExp, string][] = [
      [{ limit: 0 }, /limit must be an integer from 1 to 10000 \(got 0\)/, 'ERR_RATE_LIMIT_INVALID_OPTION'],
      [{ limit: 2.5 }, /limit must be an integer/, 'ERR_RATE_LIMIT_INVALID_OPTION'],
      [{ limit: 2, leaseMs: 50 }, /leaseMs must be an integer from 100 to 3600000 \(got 50\)/, 'ERR_RATE_LIMIT_INVALID_OPTION'],
      [{ limit: 2, maxWaitMs: -1 }, /maxWaitMs must be an integer from 0 to 600000/, 'ERR_RATE_LIMIT_INVALID_OPTION'],
      [{ limit: 2, signal: 'no' }, /signal must be an AbortSignal/, 'ERR_RATE_LIMIT_INVALID_OPTION'],
      [{ limit: 2, failureMode: 'sometimes' }, /failureMode must be 'open', 'closed' or 'local'/, 'ERR_RATE_LIMIT_INVALID_OPTION'],
      [{ limit: 2, leaseMS: 100 }, /unknown key "leaseMS" in the options \(did you mean "leaseMs"\?\)/, 'ERR_RATE_LIMIT_UNKNOWN_OPTION'],
      [null, /options must be \{ limit, leaseMs\?, maxWaitMs\?, signal\?, failureMode\? \}/, 'ERR_RATE_LIMIT_INVALID_OPTION'],
    ];
    for (const [options, message, code] of calls) {
      const error = await buckets.takeSlot('checked', options as never).catch((thrown: unknown) => thrown);
      expect(error).toMatchObject({ code });
      expect((error as Error).message).toMatch(/^BucketService\.takeSlot\("checked"\): /);
      expect((error as Error).message).toMatch(message);
    }
    await expect(buckets.takeSlot('', { limit: 1 })).rejects.toMatchObject({ code: 'ERR_RATE_LIMIT_INVALID_POLICY' });
    expect(await slotsOf('checked')).toEqual({});
  });

  it('keeps the same rules on the memory store', async () => {
    await open('memory');
    const a = await buckets.takeSlot('mem', { limit: 1 });
    const b = await buckets.takeSlot('mem', { limit: 1 });
    expect([a.held, a.source, b.held, b.inFlight]).toEqual([true, 'store', false, 1]);
    await a.release();
    expect((await buckets.takeSlot('mem', { limit: 1 })).held).toBe(true);
  });
});
