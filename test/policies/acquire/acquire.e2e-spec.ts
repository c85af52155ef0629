import { Injectable, Module } from '@nestjs/common';
import { Test, type TestingModule } from '@nestjs/testing';
import { Redis } from 'ioredis';
import {
  BucketService,
  Paced,
  type RateLimitConfigError,
  RateLimitModule,
  RateLimitWaitTooLongError,
  RedisBucketStore,
} from 'nest-redis-rate-limit';
import { commandCalls, RedisServer, redisNow, redisUrl } from '../../support/redis.js';
import { redisScenario } from '../../support/scenario.js';

/**
 * Issue 23: `BucketService.acquire()` against the real Redis: one reservation per call, refused at once
 * beyond `maxWaitMs` with nothing reserved, given back when aborted or when the app closes, seen by
 * `consume()` as tokens already taken, and beside a penalty. Timing (pace, fairness across processes,
 * failure modes) is in acquire.timing.e2e-spec.ts.
 */
const SLOW = { capacity: 2, refillPerSecond: 1 };

async function serviceOn(redis: string, keyPrefix: string, extra: Record<string, unknown> = {}): Promise<TestingModule> {
  const moduleRef = await Test.createTestingModule({ imports: [RateLimitModule.forRoot({ redis, keyPrefix, ...extra })] }).compile();
  moduleRef.useLogger(false);
  await moduleRef.init();
  return moduleRef;
}

/** The stored fields of a bucket. */
async function stored(client: Redis, key: string): Promise<{ tokens: number; ts: number }> {
  const [tokens, ts] = await client.hmget(key, 'tokens', 'ts');
  return { tokens: Number(tokens), ts: Number(ts) };
}

describe('BucketService.acquire() against Redis', () => {
  const scenario = redisScenario('acquire');
  let moduleRef: TestingModule;
  let buckets: BucketService;
  let prefix: string;

  beforeAll(async () => {
    prefix = scenario.nextKeyPrefix();
    moduleRef = await serviceOn(await redisUrl(), prefix);
    buckets = moduleRef.get(BucketService);
  });

  afterAll(() => moduleRef?.close());

  it('answers at once, with no wait, while the bucket has the tokens', async () => {
    const started = performance.now();
    const decision = await buckets.acquire('ready', SLOW);
    const took = performance.now() - started;
    expect(decision).toMatchObject({ allowed: true, limit: 2, remaining: 1, retryAfterSeconds: 0, scheduledWaitMs: 0 });
    // waitedMs is the call's own time: the round trip only (a time bound on it would measure the machine).
    expect(decision.waitedMs).toBeGreaterThan(0);
    expect(decision.waitedMs).toBeLessThanOrEqual(took);
  });

  it("tells each turn on Redis' clock: Redis' time of the decision + the wait", async () => {
    const policy = { capacity: 1, refillPerSecond: 20 };
    const before = await redisNow(scenario.client);
    const [first, second] = await Promise.all([buckets.acquire('turns', policy), buckets.acquire('turns', policy)]);
    const after = await redisNow(scenario.client);
    // The first had its token: its turn is the decision, between the two TIME readings.
    expect(first.scheduledWaitMs).toBe(0);
    expect(first.turnAt).toBeGreaterThanOrEqual(before);
    expect(first.turnAt).toBeLessThanOrEqual(after);
    // The second waited for the next token, 50 ms after the first (the script's whole ms: up to 1 less).
    expect(second.turnAt! - first.turnAt!).toBeGreaterThanOrEqual(49);
    expect(second.turnAt! - first.turnAt!).toBeLessThanOrEqual(50);
    expect(second.turnAt! - second.scheduledWaitMs).toBeGreaterThanOrEqual(first.turnAt!);
  });

  it('rejects at once when the wait would exceed maxWaitMs, with the wait it needed, and reserves nothing', async () => {
    await buckets.acquire('too-long', SLOW, { cost: 2 });
    const before = await scenario.client.hgetall(`${prefix}{too-long}`);
    const started = performance.now();
    const error = await buckets.acquire('too-long', SLOW, { cost: 2, maxWaitMs: 1500 }).catch((e: unknown) => e);
    // At once: not after the 1,500 ms it may not wait (a generous bound: the machine may be busy).
    expect(performance.now() - started).toBeLessThan(1000);
    const decidedBy = await redisNow(scenario.client);
    expect(error).toBeInstanceOf(RateLimitWaitTooLongError);
    expect(error).toMatchObject({ code: 'ERR_RATE_LIMIT_WAIT_TOO_LONG', maxWaitMs: 1500, retryAfterSeconds: 2 });
    // Two tokens at 1/s from empty: 2 s less the refill since the bucket was emptied (its stamp).
    expect((error as RateLimitWaitTooLongError).waitMs).toBeGreaterThanOrEqual(2000 - (decidedBy - Number(before.ts)));
    expect((error as RateLimitWaitTooLongError).waitMs).toBeLessThanOrEqual(2000);
    expect(await scenario.client.hgetall(`${prefix}{too-long}`)).toEqual(before);
  });

  it('rounds the refused wait up to whole seconds: 1.4 s less the time since the bucket emptied is a retryAfterSeconds of 2', async () => {
    // 7 tokens at 5/s: emptied, the next 7 come 1,400 ms after the stamp. Within the 400 ms after it, the
    // wait is from 1,001 to 1,400 ms: Math.ceil gives 2 s, Math.round would give 1 s (sooner than the tokens).
    const policy = { capacity: 7, refillPerSecond: 5 };
    await buckets.acquire('round-up', policy, { cost: 7 });
    const emptied = await stored(scenario.client, `${prefix}{round-up}`);
    const error = await buckets.acquire('round-up', policy, { cost: 7, maxWaitMs: 500 }).catch((e: unknown) => e);
    const decidedBy = await redisNow(scenario.client);
    expect(error).toBeInstanceOf(RateLimitWaitTooLongError);
    const { waitMs, retryAfterSeconds } = error as RateLimitWaitTooLongError;
    expect(waitMs).toBeLessThanOrEqual(1400);
    expect(waitMs).toBeGreaterThanOrEqual(1400 - (decidedBy - emptied.ts));
    // The precondition of the case: a wait that Math.round and Math.ceil tell apart (a machine that took
    // 400 ms between two calls would make it a wait of 1 s, which both round alike).
    expect(waitMs).toBeGreaterThan(1000);
    expect(retryAfterSeconds).toBe(2);
  });

  it('makes consume() behind reservations refuse, with a Retry-After that counts them', async () => {
    await buckets.acquire('queue', SLOW, { cost: 2 });
    const emptied = await stored(scenario.client, `${prefix}{queue}`);
    const controller = new AbortController();
    const waiting = buckets.acquire('queue', SLOW, { cost: 2, signal: controller.signal });
    await new Promise((resolve) => setTimeout(resolve, 30));
    // 0 tokens, 2 of them reserved: a cost of 1 needs 3 s of refill.
    const refused = await buckets.consume('queue', SLOW, 1);
    expect(refused).toMatchObject({ allowed: false, remaining: 0, retryAfterSeconds: 3, resetSeconds: 4 });
    // The reservation's 2 tokens stay taken: -2 plus the refill since the bucket was emptied.
    const queued = await stored(scenario.client, `${prefix}{queue}`);
    expect(queued.tokens - (queued.ts - emptied.ts) / 1000).toBeCloseTo(-2, 9);
    controller.abort(new Error('no longer needed'));
    const error = await waiting.catch((e: unknown) => e);
    expect(error).toMatchObject({ name: 'AbortError', cause: new Error('no longer needed') });
  });

  /** B = 1, R = 2: a first call empties the bucket, two more wait (turns 500 and 1000 ms after it), one of them with `signal`. */
  async function queueOfThree(name: string, abortable: 'second' | 'third') {
    const key = `${prefix}{${name}}`;
    const policy = { capacity: 1, refillPerSecond: 2 };
    await buckets.acquire(name, policy);
    const first = await stored(scenario.client, key);
    expect(first.tokens).toBe(0);
    const controller = new AbortController();
    const second = buckets.acquire(name, policy, abortable === 'second' ? { signal: controller.signal } : {});
    const third = buckets.acquire(name, policy, abortable === 'third' ? { signal: controller.signal } : {});
    await new Promise((resolve) => setTimeout(resolve, 20));
    const before = await stored(scenario.client, key);
    // Two tokens reserved, plus the refill between the first write and the third (on a busy machine
    // the three calls may be written tens of ms apart).
    expect(before.tokens - ((before.ts - first.ts) * 2) / 1000).toBeCloseTo(-2, 9);
    controller.abort();
    await expect(abortable === 'second' ? second : third).rejects.toMatchObject({ name: 'AbortError' });
    await new Promise((resolve) => setTimeout(resolve, 20));
    const after = await stored(scenario.client, key);
    const fourth = buckets.acquire(name, policy);
    return { policy, first, before, after, kept: abortable === 'second' ? third : second, fourth };
  }

  it('gives the last waiting reservation back: the bucket gets its cost again, and the next caller takes its turn', async () => {
    const { first, before, after, kept, fourth } = await queueOfThree('abort-last', 'third');
    // Exactly one token back, plus the refill between the two writes.
    expect(after.tokens - before.tokens - ((after.ts - before.ts) * 2) / 1000).toBeCloseTo(1, 9);
    const [t2, t4] = await Promise.all([kept, fourth]);
    // By Redis' clock (the script's whole ms: up to 1 off): the second's turn is when the bucket, emptied by the
    // first, has refilled a token (500 ms); the fourth takes the aborted third's turn, a token later.
    expect(Math.abs(t2.turnAt! - (first.ts + 500))).toBeLessThanOrEqual(1);
    expect(Math.abs(t4.turnAt! - (first.ts + 1000))).toBeLessThanOrEqual(1);
  });

  it('gives nothing back for an aborted wait with another behind it: the next caller goes after the last turn (issue 32)', async () => {
    const { first, before, after, kept, fourth } = await queueOfThree('abort-middle', 'second');
    // No token back: the third keeps its turn at 1000 ms; a token given back would let the fourth share it
    // (two grants in one moment where B = 1 allows one). The bucket under-admits for the second's moment.
    expect(after.tokens - before.tokens - ((after.ts - before.ts) * 2) / 1000).toBeCloseTo(0, 9);
    const [t3, t4] = await Promise.all([kept, fourth]);
    expect(Math.abs(t3.turnAt! - (first.ts + 1000))).toBeLessThanOrEqual(1);
    expect(Math.abs(t4.turnAt! - (first.ts + 1500))).toBeLessThanOrEqual(1);
  });

  it('rejects at once, reserving nothing, when the signal is aborted already', async () => {
    const error = await buckets.acquire('pre-aborted', SLOW, { signal: AbortSignal.abort('gone') }).catch((e: unknown) => e);
    expect(error).toMatchObject({ name: 'AbortError', cause: 'gone' });
    expect(await scenario.client.exists(`${prefix}{pre-aborted}`)).toBe(0);
  });

  it('refuses unknown options and a maxWaitMs beyond the module bound', async () => {
    await expect(buckets.acquire('x', SLOW, { maxWait: 5 } as never)).rejects.toMatchObject({ code: 'ERR_RATE_LIMIT_UNKNOWN_OPTION' });
    await expect(buckets.acquire('x', SLOW, { maxWaitMs: 60_001 })).rejects.toMatchObject({ code: 'ERR_RATE_LIMIT_INVALID_OPTION' });
    await expect(buckets.acquire('x', SLOW, { cost: 3 })).rejects.toMatchObject({ code: 'ERR_RATE_LIMIT_INVALID_POLICY' });
  });

  it.each([
    ['an object that is no AbortSignal', { aborted: false, addEventListener() {} }, 'signal must be an AbortSignal (got [object Object])'],
    ['an AbortController', new AbortController(), 'signal must be an AbortSignal (got [object AbortController])'],
    ['a string', 'abort', 'signal must be an AbortSignal (got "abort")'],
  ])('refuses %s as the signal with ERR_RATE_LIMIT_INVALID_OPTION, reserving nothing', async (_, signal, says) => {
    const error = await buckets.acquire('bad-signal', SLOW, { signal: signal as never }).catch((e: unknown) => e);
    expect(error).toMatchObject({ name: 'RateLimitConfigError', code: 'ERR_RATE_LIMIT_INVALID_OPTION' });
    expect((error as RateLimitConfigError).reason).toBe(`BucketService.acquire("bad-signal"): ${says}`);
    expect(await scenario.client.exists(`${prefix}{bad-signal}`)).toBe(0);
  });

  it('keeps a penalty and reservations of one bucket: neither undoes the other', async () => {
    const client = new Redis(await redisUrl());
    const store = new RedisBucketStore(client, false);
    const key = `${prefix}{penalty}`;
    const numbers = { key, capacity: 2, refillPerSecond: 1 };
    try {
      // Each stored value is checked against the refill since an earlier write, read from the stamps: on a busy
      // machine the writes can be hundreds of ms apart (1 token/s), so a fixed tolerance would not hold.
      const since = (now: { tokens: number; ts: number }, then: { ts: number }) => now.tokens - (now.ts - then.ts) / 1000;
      await store.take([{ ...numbers, cost: 2 }], { reserve: { maxWaitMs: 60_000, boundMs: 60_000 } });
      const emptied = await stored(client, key);
      expect(emptied.tokens).toBe(0);
      const reserved = await store.take([{ ...numbers, cost: 1 }], { reserve: { maxWaitMs: 60_000, boundMs: 60_000 } });
      expect(reserved).toMatchObject({ allowed: true });
      const afterReserve = await stored(client, key);
      expect(reserved.tokens[0]).toBeCloseTo(afterReserve.tokens, 9);
      expect(since(afterReserve, emptied)).toBeCloseTo(-1, 9);
      // A refused take with a 10 s penalty: min(tokens, 1 - 10) = -9, and the penalty's end stored.
      const refused = await store.take([{ ...numbers, cost: 1, blockSeconds: 10 }]);
      expect(refused.allowed).toBe(false);
      const penalised = await stored(client, key);
      expect(penalised.tokens).toBe(-9);
      expect(Number(await client.hget(key, 'b'))).toBe(penalised.ts + 10_000);
      expect(refused.penaltyMs?.[0]).toBe(10_000);
      // A take without a penalty (the usual call) keeps the negative tokens: no repair to 0.
      expect((await store.take([{ ...numbers, cost: 1 }])).allowed).toBe(false);
      expect(since(await stored(client, key), penalised)).toBeCloseTo(-9, 9);
      // A reservation while the penalty runs waits until it ends, and counts every token before it.
      const late = await store.take([{ ...numbers, cost: 1 }], { reserve: { maxWaitMs: 60_000, boundMs: 60_000 } });
      const reservedLate = await stored(client, key);
      expect(since(reservedLate, penalised)).toBeCloseTo(-10, 9);
      expect(late.waitMs).toBe(penalised.ts + 10_000 - reservedLate.ts);
      expect(await client.hget(key, 'b')).not.toBeNull();
      // The TTL covers the time to refill to full from -10 at 1/s (12 s), not just the idle 4 s.
      expect(await client.pttl(key)).toBeGreaterThan(11_000);
    } finally {
      await client.quit();
    }
  });

  it('paces a @Paced provider method, the bucket name and cost from its arguments', async () => {
    @Injectable()
    class PartnerClient {
      calls: string[] = [];
      @Paced<[string, number]>({ name: (tenant) => `partner:${tenant}`, capacity: 10, refillPerSecond: 1, cost: (_t, pages) => pages })
      async fetch(tenant: string, pages: number): Promise<string> {
        this.calls.push(`${tenant}:${pages}`);
        return `${tenant} ${pages}`;
      }
    }
    @Module({ providers: [PartnerClient] })
    class PartnerModule {}
    const own = await Test.createTestingModule({
      imports: [RateLimitModule.forRoot({ redis: await redisUrl(), keyPrefix: scenario.nextKeyPrefix() }), PartnerModule],
    }).compile();
    own.useLogger(false);
    await own.init();
    try {
      const partner = own.get(PartnerClient);
      const ownPrefix = (own.get(BucketService) as unknown as { options: { keyPrefix: string } }).options.keyPrefix;
      const before = await redisNow(scenario.client);
      expect(await partner.fetch('acme', 3)).toBe('acme 3');
      expect(await partner.fetch('acme', 4)).toBe('acme 4');
      expect(await partner.fetch('globex', 1)).toBe('globex 1');
      // 10 - 3 - 4, and what refilled between the two writes (at most the time since `before`), within
      // the rounding of the stored double (a quiet run read 3.0010000000000003 for 1 ms of refill).
      const acme = await stored(scenario.client, `${ownPrefix}{partner:acme}`);
      expect(acme.tokens).toBeGreaterThanOrEqual(3);
      expect(acme.tokens).toBeLessThanOrEqual(3 + (acme.ts - before) / 1000 + 1e-9);
      const globex = await stored(scenario.client, `${ownPrefix}{partner:globex}`);
      expect(globex.tokens).toBe(9);
      // Ten pages with nine tokens at the stamp: the method runs only once the tenth has refilled, 1 s after it.
      expect(await partner.fetch('globex', 10)).toBe('globex 10');
      expect(await redisNow(scenario.client)).toBeGreaterThanOrEqual(globex.ts + 1000 - 1);
      expect(partner.calls).toEqual(['acme:3', 'acme:4', 'globex:1', 'globex:10']);
    } finally {
      await own.close();
    }
  }, 15_000);

  it('rejects a @Paced call when no application with RateLimitModule runs, and the method does not run', async () => {
    let ran = false;
    class Orphan {
      @Paced({ name: 'orphan', capacity: 1, refillPerSecond: 1 })
      async go(): Promise<void> {
        ran = true;
      }
    }
    await moduleRef.close();
    try {
      await expect(new Orphan().go()).rejects.toMatchObject({ code: 'ERR_RATE_LIMIT_MODULE_NOT_IMPORTED' });
      expect(ran).toBe(false);
    } finally {
      moduleRef = await serviceOn(await redisUrl(), prefix);
      buckets = moduleRef.get(BucketService);
    }
  });
});

describe('acquire() and the application lifecycle', () => {
  const scenario = redisScenario('acquire-close');
  /**
   * The test's module, closed after the test whatever happened: a failed assertion before the test's own
   * close() would leave its Redis connection and the waiters' timers open, and Jest would wait for them
   * ("did not exit") until killed. A test that closes it itself clears it first (close() runs once).
   */
  let running: TestingModule | undefined;

  afterEach(async () => {
    const left = running;
    running = undefined;
    await left?.close();
  });

  /** Closes the test's module now (what the test is about), so that afterEach does not close it again. */
  function closeRunning(): Promise<void> {
    const moduleRef = running!;
    running = undefined;
    return moduleRef.close();
  }

  it('app.close() rejects the waiting calls and gives their reservations back', async () => {
    const prefix = scenario.nextKeyPrefix();
    running = await serviceOn(await redisUrl(), prefix);
    const buckets = running.get(BucketService);
    await buckets.acquire('closing', SLOW, { cost: 2 });
    const emptied = await stored(scenario.client, `${prefix}{closing}`);
    const waiting = [buckets.acquire('closing', SLOW), buckets.acquire('closing', SLOW, { cost: 2 })];
    const outcomes = Promise.allSettled(waiting);
    await new Promise((resolve) => setTimeout(resolve, 30));
    const before = await stored(scenario.client, `${prefix}{closing}`);
    expect(before.tokens - (before.ts - emptied.ts) / 1000).toBeCloseTo(-3, 9);
    await closeRunning();
    for (const outcome of await outcomes) {
      expect(outcome).toMatchObject({ status: 'rejected', reason: { code: 'ERR_RATE_LIMIT_SHUTTING_DOWN' } });
    }
    const after = await stored(scenario.client, `${prefix}{closing}`);
    expect(after.tokens - before.tokens - (after.ts - before.ts) / 1000).toBeCloseTo(3, 9);
  });

  it('refuses a call beyond acquire.maxWaiting, reserving nothing', async () => {
    const prefix = scenario.nextKeyPrefix();
    running = await serviceOn(await redisUrl(), prefix, { acquire: { maxWaiting: 2 } });
    const buckets = running.get(BucketService);
    const first = buckets.acquire('full', SLOW, { cost: 2 });
    const second = buckets.acquire('full', SLOW, { cost: 2 }).catch((e: unknown) => e);
    await expect(buckets.acquire('full', SLOW)).rejects.toMatchObject({ code: 'ERR_RATE_LIMIT_TOO_MANY_WAITING' });
    await first;
    await closeRunning();
    expect(await second).toMatchObject({ code: 'ERR_RATE_LIMIT_SHUTTING_DOWN' });
  });
});

describe('acquire() costs one script call', () => {
  let server: RedisServer;
  let moduleRef: TestingModule | undefined;

  afterAll(async () => {
    await moduleRef?.close();
    await server?.stop();
  });

  it('decides a burst of 200 acquire() calls in a few shared script calls (INFO commandstats of a Redis of its own)', async () => {
    server = await RedisServer.start();
    // A count of round trips, not of deadlines: a call that timed out on a loaded machine would go ahead
    // under 'open' without its reservation (no wait to see); 'closed' and a long timeoutMs rule that out.
    moduleRef = await serviceOn(server.url, 'count:', { failureMode: 'closed', timeoutMs: 10_000 });
    const buckets = moduleRef.get(BucketService);
    const admin = new Redis(server.url);
    try {
      // 50 calls a bucket on 5 tokens at 100/s: 45 wait, up to 0.45 s. (At 1,000/s, a loaded machine wrote
      // the 200 calls more slowly than the tokens refilled, and none waited.)
      const policy = { capacity: 5, refillPerSecond: 100 };
      // The script is loaded once (the start-up check, then EVALSHA).
      await buckets.acquire('warm', policy);
      const before = await commandCalls(admin, 'evalsha');
      const evalBefore = await commandCalls(admin, 'eval');
      const decisions = await Promise.all(Array.from({ length: 200 }, (_, i) => buckets.acquire(`count:${i % 4}`, policy)));
      expect(decisions.some((d) => d.scheduledWaitMs > 0)).toBe(true);
      const calls = (await commandCalls(admin, 'evalsha')) - before + (await commandCalls(admin, 'eval')) - evalBefore;
      // Coalesced like takes (issue 32): the first call of the turn alone, the other 199 in shared calls of
      // at most 64 decisions (4 of them), the calls of each bucket as one batch. A call per acquire would be 200.
      expect(calls).toBeGreaterThanOrEqual(2);
      expect(calls).toBeLessThanOrEqual(6);
      // Each bucket's 50 calls in the order they were made: turns never go backwards within a bucket.
      for (let b = 0; b < 4; b++) {
        const turns = decisions.filter((_, i) => i % 4 === b).map((d) => d.turnAt!);
        expect(turns).toEqual([...turns].sort((x, y) => x - y));
      }
    } finally {
      await admin.quit();
    }
  }, 20_000);
});
