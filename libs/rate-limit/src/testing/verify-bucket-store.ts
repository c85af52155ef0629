import fc from 'fast-check';
import type { BucketStore } from '../stores/bucket-store.interface.js';
import { BucketModel, type ModelRequest } from './bucket-model.js';
import { KEYS, MAX_NOW, reservationBound, reservationWait, type Scenario, scenarioArb, T0 } from './scenarios.js';
import { checkFloors, compareResult, fail, resolveCost, resolveFloor } from './compare.js';
import { combinesSlots, holdsSlots, type SlotStore } from '../stores/slots.js';
import { checkTakeWithSlot } from './take-with-slot-check.js';
import { runSlotScenario, SLOT_KEYS, slotScenarioArb } from './slot-check.js';

export interface VerifyBucketStoreOptions {
  /** Random sequences to run. Default 100. */
  runs?: number;
  /** fast-check's seed, to replay a failure (its message prints the seed and the shrunk sequence). Default: random. */
  seed?: number;
  /** Prefix of every key the check uses; give each run its own (the keys are left to expire). Default `conformance:<random>:`. */
  keyPrefix?: string;
  /**
   * Also draw reservations (`TakeOptions.reserve`, `BucketService.acquire()`) and their give-backs (an aborted
   * wait), for a store that implements `BucketStore` rule 9. Default false.
   */
  reservations?: boolean;
  /**
   * Also draw floors (`BucketRequest.floor`, a priority's reserve) on takes, peeks and refunds, for a store
   * that implements them: a store used by routes or `BucketService` calls with a priority must. Default false.
   */
  priorities?: boolean;
  /**
   * Also check the store's concurrency slots (`SlotStore`: `takeSlot`, `giveBackSlot`, and `takeWithSlot`
   * when it has one: testing/take-with-slot-check.ts) against the model of
   * slots: as many sequences again of takes, renewals, give-backs (own, twice, a stranger's) and clock
   * advances past leases over two keys, each with its own limit. Needs `SlotCallOptions.now` honoured as the
   * store's clock for takes. Default false.
   */
  slots?: boolean;
}

/** Added to a bucket's TTL before it counts as possibly expired in real time. */
const REAL_TIME_SLACK_MS = 100;

/**
 * Checks a `BucketStore` against the library's reference model of the token bucket, the property test
 * the Redis script and the memory store pass: fast-check draws policies (capacity 1 to 1e12, refill up
 * to Number.MAX_VALUE per second, penalties with their cost) and sequences of take, peek (`dryRun`),
 * refund and reset (`delete`) over up to three keys at once, with the clock advancing and stepping back
 * and forth; every reply must match the model: allowed exactly, each bucket's tokens within 1e-9
 * (relative from one token up), `penaltyMs` when the store reports it (whole ms may be rounded down).
 * Rejects with the first mismatch, shrunk to a short sequence, and the seed that replays it.
 *
 * What it needs from the store: `TakeOptions.now` is honoured as the store's clock (time is simulated).
 * What it cannot see: the store's TTLs and stored fields. A bucket whose time (on the simulated clock) has
 * run out is deleted before the next call, as its TTL would; one whose TTL may have run out in real time
 * (a window of a few ms, in a store that counts TTLs in real time, as Redis does) is reset in the store
 * and the model alike. With `slots: true`, the store's concurrency slots are checked against the model of
 * slots (testing/slot-model.ts says what it promises). Framework-neutral: call it in a Jest, Vitest or node:test case.
 *
 * ```ts
 * it('keeps the BucketStore contract', () => verifyBucketStore(new MyStore(client), { runs: 200 }), 60_000);
 * ```
 */
export async function verifyBucketStore(store: BucketStore, options: VerifyBucketStoreOptions = {}): Promise<void> {
  // Narrowed in one expression: apps compile this file with strict off too (Nest's default), where a
  // type guard's narrowing does not carry over to a later statement.
  let slotStore: (BucketStore & SlotStore) | undefined;
  if (options.slots === true) {
    if (!holdsSlots(store))
      throw new Error('BucketStore conformance: slots: true, but the store has no takeSlot() and giveBackSlot() (SlotStore)');
    slotStore = store;
  }
  const prefix = options.keyPrefix ?? `conformance:${Math.random().toString(36).slice(2, 10)}:`;
  let run = 0;
  const scenario = async ({ policies, alternatives, ops }: Scenario): Promise<void> => {
    const keys = Array.from({ length: KEYS }, (_, k) => `${prefix}${run}:{k${k}}`);
    run++;
    const model = new BucketModel();
    /**
     * Per key, the reservations still held and what their give-backs name: an abort gives back the last
     * one, or on odd steps the first (from the middle of the queue, where nothing may be given back).
     */
    const held: { cost: number; mark: { tokens: number; nowMs: number } }[][] = keys.map(() => []);
    /** When each bucket's TTL runs out in real time (performance.now), for a store that counts it so. */
    const realExpiry = new Map<string, number>();
    let now = T0;
    try {
      for (let step = 0; step < ops.length; step++) {
        const op = ops[step];
        if (op.op === 'advance') now = Math.min(MAX_NOW, now + op.ms);
        else if (op.op === 'step') now = Math.min(MAX_NOW, Math.max(T0 - 1e12, now + op.ms));
        else if (op.op === 'reset') {
          await store.delete([keys[op.k]]);
          model.delete(keys[op.k]);
          realExpiry.delete(keys[op.k]);
        } else if (op.op === 'reserve' || op.op === 'abort') {
          const policy = policies[op.k];
          const base = { key: keys[op.k], capacity: policy.capacity, refillPerSecond: policy.refillPerSecond };
          if (model.expired(base.key, now) || (realExpiry.get(base.key) ?? Infinity) <= performance.now() + REAL_TIME_SLACK_MS) {
            await store.delete([base.key]);
            model.delete(base.key);
            realExpiry.delete(base.key);
            held[op.k] = [];
          }
          if (op.op === 'abort') {
            const reservation = step % 2 === 0 ? held[op.k].pop() : held[op.k].shift();
            if (reservation === undefined) continue;
            const { cost, mark } = reservation;
            const result = await store.take([{ ...base, cost }], { now, refund: true, givesBack: mark });
            const expected = model.decide([{ ...base, cost }], 'refund', now, false, mark);
            compareResult('store', step, result, expected, [{ ...base, cost }], true);
            continue;
          }
          const tokens = model.decide([{ ...base, cost: 0 }], 'peek', now, true).tokens[0];
          const request = { ...base, cost: resolveCost(op.cost, policy, tokens) };
          const boundMs = reservationBound(op.boundMs, policy.refillPerSecond);
          const maxWaitMs = reservationWait(op.maxWait, boundMs);
          const sent = performance.now();
          const result = await store.take([request], { now, reserve: { maxWaitMs, boundMs } });
          const expected = model.reserve(request, maxWaitMs, boundMs, now);
          const outcome = { allowed: expected.allowed, tokens: [expected.tokens], ttlSet: [expected.ttlSet], written: [], running: [] };
          compareResult('store', step, result, outcome, [request], true);
          if (result.waitMs !== expected.waitMs)
            fail('the wait of a reservation differs from the model', { step, request, result, expected });
          if (expected.allowed) held[op.k].push({ cost: request.cost, mark: { tokens: result.tokens[0], nowMs: now } });
          if (expected.ttlSet !== undefined)
            realExpiry.set(request.key, Math.max(realExpiry.get(request.key) ?? -Infinity, sent + expected.ttlSet));
        } else if (op.op !== 'corrupt') {
          const requests: ModelRequest[] = op.buckets.map(({ k, cost, alt, floor }) => {
            const policy = alt < 0 ? policies[k] : alternatives[alt];
            const held = model.decide([{ key: keys[k], ...policy, cost: 0 }], 'peek', now, true).tokens[0];
            const request: ModelRequest = { key: keys[k], ...policy, cost: resolveCost(cost, policy, held) };
            const kept = resolveFloor(floor, policy, held, request.cost);
            if (kept !== undefined) request.floor = kept;
            return request;
          });
          const realNow = performance.now();
          const gone = requests
            .map((r) => r.key)
            .filter((key) => model.expired(key, now) || (realExpiry.get(key) ?? Infinity) <= realNow + REAL_TIME_SLACK_MS);
          if (gone.length > 0) {
            await store.delete(gone);
            for (const key of gone) {
              model.delete(key);
              realExpiry.delete(key);
            }
          }
          const sent = performance.now();
          const result = await store.take(requests, { now, dryRun: op.op === 'peek', refund: op.op === 'refund' });
          const expected = model.decide(requests, op.op, now);
          compareResult('store', step, result, expected, requests, true);
          if (op.op === 'take') checkFloors('store', step, result, requests);
          requests.forEach((r, i) => {
            const ttl = expected.ttlSet[i];
            if (ttl !== undefined) realExpiry.set(r.key, Math.max(realExpiry.get(r.key) ?? -Infinity, sent + ttl));
          });
        }
      }
    } finally {
      await store.delete(keys).catch(() => undefined);
    }
  };
  const settings = { numRuns: options.runs ?? 100, ...(options.seed === undefined ? {} : { seed: options.seed }) };
  const details = await fc.check(
    fc.asyncProperty(scenarioArb(false, options.reservations === true, options.priorities === true), scenario),
    settings,
  );
  if (details.failed) report(details);
  if (!slotStore) return;
  const slots = await fc.check(
    fc.asyncProperty(slotScenarioArb(false), async (sequence) => {
      const keys = Array.from({ length: SLOT_KEYS }, (_, k) => `${prefix}slots:${run}:{k${k}}`);
      run++;
      try {
        await runSlotScenario(slotStore, sequence, keys);
      } finally {
        await store.delete(keys).catch(() => undefined);
      }
    }),
    settings,
  );
  if (slots.failed) report(slots);
  if (combinesSlots(slotStore)) await checkTakeWithSlot(slotStore, `${prefix}with-slot:`);
}

function report<Ts>(details: fc.RunDetails<Ts>): never {
  // The rule broken first, then fast-check's report (seed, path and the shrunk sequence to replay it). A test's
  // failure report, thrown into the caller's test runner: not a library error, so no code.
  const error = details.errorInstance;
  const why = error instanceof Error ? error.message : String(error);
  throw new Error(`BucketStore conformance: ${why}\n${fc.defaultReportMessage(details) ?? ''}`, { cause: error });
}
