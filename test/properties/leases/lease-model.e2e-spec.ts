import fc from 'fast-check';
import { Redis } from 'ioredis';
import { RedisBucketStore } from 'nest-redis-rate-limit';
import type { BucketRequest } from '../../../libs/rate-limit/src/stores/token-bucket.js';
import { deleteKeys, redisUrl, testPrefix } from '../../support/redis.js';

/**
 * Issue 35, item 5: leased tokens never over-admit. fast-check draws a bucket (B, R) and random
 * interleavings, over up to three holders (app instances) and one exact caller, of: a lease call (keep
 * what the holder still has, give some back, ask for more), local spends from a holder's lease, exact
 * takes (decide.lua, as a cold key's decisions go), refunds, a holder that crashes (its tokens are
 * lost, its lease stays in Redis until it ends), and time steps. Every call goes to the real scripts
 * (the test-only `now` argument); every admission, leased or exact, is then replayed through an exact
 * token bucket of the same B and R that starts full: each must find a whole token there. That is the
 * promise: whatever the interleaving, leases admit nothing one exact bucket would not.
 *
 * A holder spends only before its lease ends by its own clock, counted from the moment it sent the call
 * (here the same simulated clock: the call's `now`). Redis counts TTLs in real time while the steps
 * count simulated time, so the draws keep the idle TTL 2B/R at 10 s or more: no key expires under a
 * sequence (a few ms of real time).
 */

const T0 = 1_800_000_000_000;

type Step =
  | { kind: 'lease'; holder: number; want: number; giveBack: number; lifeMs: number }
  | { kind: 'spend'; holder: number; count: number }
  | { kind: 'take'; cost: number }
  | { kind: 'refund'; cost: number }
  | { kind: 'crash'; holder: number }
  | { kind: 'wait'; ms: number };

const stepArb: fc.Arbitrary<Step> = fc.oneof(
  {
    weight: 4,
    arbitrary: fc.record({
      kind: fc.constant('lease' as const),
      holder: fc.nat(2),
      want: fc.nat(40),
      giveBack: fc.nat(10),
      lifeMs: fc.integer({ min: 1, max: 5_000 }),
    }),
  },
  { weight: 6, arbitrary: fc.record({ kind: fc.constant('spend' as const), holder: fc.nat(2), count: fc.integer({ min: 1, max: 40 }) }) },
  { weight: 2, arbitrary: fc.record({ kind: fc.constant('take' as const), cost: fc.integer({ min: 0, max: 10 }) }) },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant('refund' as const), cost: fc.integer({ min: 1, max: 4 }) }) },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant('crash' as const), holder: fc.nat(2) }) },
  {
    weight: 4,
    arbitrary: fc.record({
      kind: fc.constant('wait' as const),
      ms: fc.oneof(fc.integer({ min: 0, max: 50 }), fc.integer({ min: 0, max: 3_000 })),
    }),
  },
);

const scenarioArb = fc.record({
  capacity: fc.integer({ min: 1, max: 20 }),
  // refill = capacity / window, window from 5 s to 60 s: the idle TTL 2B/R stays at 10 s or more.
  windowSeconds: fc.integer({ min: 5, max: 60 }),
  steps: fc.array(stepArb, { minLength: 1, maxLength: 60 }),
});

interface Holder {
  pool: number;
  /** When its lease ends by its own clock (the call's now + lifeMs); spends stop then. */
  until: number;
}

describe('leases against an exact bucket (fast-check)', () => {
  const prefix = testPrefix('lease-model');
  let client: Redis;
  let store: RedisBucketStore;
  let run = 0;
  const totals = { leased: 0, spent: 0, exact: 0, refusedSpends: 0, expiredSpends: 0 };

  beforeAll(async () => {
    client = new Redis(await redisUrl());
    store = new RedisBucketStore(client, false);
  });

  afterAll(async () => {
    await deleteKeys(client, `${prefix}*`);
    client?.disconnect();
  });

  async function runScenario({
    capacity,
    windowSeconds,
    steps,
  }: {
    capacity: number;
    windowSeconds: number;
    steps: Step[];
  }): Promise<void> {
    const request: BucketRequest = { key: `${prefix}{k${run++}}`, capacity, refillPerSecond: capacity / windowSeconds, cost: 1 };
    const rate = request.refillPerSecond;
    const holders: Holder[] = [0, 1, 2].map(() => ({ pool: 0, until: 0 }));
    /** Admissions (n > 0) and refunds (n < 0) in order, at their times. */
    const events: { time: number; n: number }[] = [];
    const admit = (time: number, n: number) => events.push({ time, n });
    let now = T0;
    for (const step of steps) {
      if (step.kind === 'wait') {
        now += step.ms;
      } else if (step.kind === 'lease') {
        const h = holders[step.holder];
        const alive = now < h.until ? h.pool : 0;
        const returned = Math.min(step.giveBack, alive);
        const answer = await store.lease(
          request,
          { holder: `h${step.holder}`, kept: alive - returned, returned, want: step.want, lifeMs: step.lifeMs },
          now,
        );
        expect(answer.kept).toBeLessThanOrEqual(alive - returned);
        expect(answer.granted).toBeLessThanOrEqual(step.want);
        h.pool = answer.kept + answer.granted;
        h.until = now + step.lifeMs;
        totals.leased += answer.granted;
      } else if (step.kind === 'spend') {
        const h = holders[step.holder];
        for (let i = 0; i < step.count; i++) {
          if (now >= h.until) {
            if (h.pool > 0) totals.expiredSpends++;
            break;
          }
          if (h.pool < 1) {
            totals.refusedSpends++;
            break;
          }
          h.pool -= 1;
          admit(now, 1);
          totals.spent++;
        }
      } else if (step.kind === 'take') {
        const result = await store.take([{ ...request, cost: step.cost }], { now });
        if (result.allowed && step.cost > 0) admit(now, step.cost);
        if (result.allowed) totals.exact += step.cost;
      } else if (step.kind === 'refund') {
        // A refund gives back what an exact take took: the replay gives it back to its bucket too (capped).
        await store.take([{ ...request, cost: step.cost }], { refund: true, now });
        admit(now, -step.cost);
      } else {
        holders[step.holder] = { pool: 0, until: 0 };
      }
    }
    // The replay: an exact bucket of the same numbers, full at the first step, must hold a token for each admission.
    let tokens = capacity;
    let at = T0;
    for (const [i, { time, n }] of events.entries()) {
      tokens = Math.min(capacity, tokens + ((time - at) * rate) / 1000);
      at = time;
      if (n < 0) {
        tokens = Math.min(capacity, tokens - n);
        continue;
      }
      if (tokens < n - 1e-9) {
        throw new Error(
          `event ${i + 1} of ${events.length} at +${time - T0} ms admits ${n} with ${tokens} tokens in the exact bucket (B ${capacity}, R ${rate}/s)`,
        );
      }
      tokens -= n;
    }
  }

  it('admits, leased and exact together, nothing an exact bucket would not (300 sequences)', async () => {
    await fc.assert(fc.asyncProperty(scenarioArb, runScenario), { numRuns: Number(process.env.LEASE_RUNS ?? 300), seed: 35_035 });
    if (process.env.LEASE_VERBOSE) console.log(totals);
    // The draws reach what they are meant to: leases granted and spent, exact takes, spends refused for want of tokens or time.
    expect(totals.leased).toBeGreaterThan(1_000);
    expect(totals.spent).toBeGreaterThan(200);
    expect(totals.exact).toBeGreaterThan(100);
    expect(totals.refusedSpends).toBeGreaterThan(20);
    expect(totals.expiredSpends).toBeGreaterThan(3);
  }, 120_000);
});
