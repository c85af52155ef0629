import fc from 'fast-check';
import type { SlotAnswer, SlotRelease, SlotStore } from '../stores/slots.js';
import { fail } from './compare.js';
import { type ModelSlotAnswer, type ModelSlotRelease, type SlotRange, SlotModel } from './slot-model.js';
import { T0 } from './scenarios.js';

/**
 * Random sequences of concurrency slots (`SlotStore`) compared with `SlotModel`: shared by
 * `verifyBucketStore(store, { slots: true })` and the repository's model test of the Redis script and the
 * memory store (test/properties/model/slot-model.e2e-spec.ts, which compares them exactly).
 */

/** Keys per sequence. */
export const SLOT_KEYS = 2;
/** Holders per key (`h0`...), and one that never takes. */
const HOLDERS = 5;
const STRANGER = 'stranger';
/**
 * Leases are 10 s to 2 min: the simulated clock decides when they end, and a store that also counts them
 * in real time (a Redis key's TTL) keeps them through a sequence.
 */
const LEASE = { min: 10_000, max: 120_000 };

/** A take's lease: the key's own, or another (a renewal that lengthens or shortens it). */
type LeasePick = { own: true } | { ms: number };

export type SlotOp =
  /** A take by holder `h` (a renewal when it holds a slot). `limit`: another limit than the key's (library mode). */
  | { op: 'take'; k: number; h: number; lease: LeasePick; limit?: number }
  /** A take by a holder the model holds (`pick` of them, live or ended): a renewal. */
  | { op: 'renew'; k: number; pick: number; lease: LeasePick }
  /** A give-back by a holder the model holds; `twice`: the same give-back again right after. */
  | { op: 'giveBack'; k: number; pick: number; twice: boolean }
  /** A give-back by a holder that never took. */
  | { op: 'stranger'; k: number }
  | { op: 'advance'; ms: number }
  /** The clock to a held lease's end, a ms before or after it (skipped if that is back, outside library mode). */
  | { op: 'toEnd'; k: number; pick: number; delta: -1 | 0 | 1 }
  /** The store's clock steps back (library mode). */
  | { op: 'back'; ms: number };

export interface SlotScenario {
  /** Drawn by `slotScenarioArb(true)`: other limits, and the clock stepping back. */
  library: boolean;
  limits: number[];
  leases: number[];
  ops: SlotOp[];
}

/**
 * The sequences. `library`: also takes with another limit than the key's, and the clock stepping back,
 * where the contract's ranges would not be enough to judge a store that drops ended slots early (a slot
 * such a store dropped comes back to life in the model); the library's stores are compared exactly.
 */
export function slotScenarioArb(library: boolean): fc.Arbitrary<SlotScenario> {
  const k = fc.nat(SLOT_KEYS - 1);
  const lease: fc.Arbitrary<LeasePick> = fc.oneof(
    { weight: 4, arbitrary: fc.constant({ own: true as const }) },
    // Mapped, not fc.record: with strictNullChecks off (Nest's default) a record's keys type as optional.
    { weight: 1, arbitrary: fc.integer(LEASE).map((ms) => ({ ms })) },
  );
  const take = library
    ? fc.record(
        { op: fc.constant('take' as const), k, h: fc.nat(HOLDERS - 1), lease, limit: fc.integer({ min: 1, max: 5 }) },
        {
          requiredKeys: ['op', 'k', 'h', 'lease'],
        },
      )
    : fc.record({ op: fc.constant('take' as const), k, h: fc.nat(HOLDERS - 1), lease });
  const ops: fc.Arbitrary<SlotOp>[] = [
    take,
    take,
    take,
    fc.record({ op: fc.constant('renew' as const), k, pick: fc.nat(), lease }),
    fc.record({ op: fc.constant('giveBack' as const), k, pick: fc.nat(), twice: fc.boolean() }),
    fc.record({ op: fc.constant('stranger' as const), k }),
    fc.record({
      op: fc.constant('advance' as const),
      ms: fc.oneof(fc.integer({ min: 1, max: 2_000 }), fc.integer({ min: 2_000, max: 150_000 })),
    }),
    fc.record({ op: fc.constant('toEnd' as const), k, pick: fc.nat(), delta: fc.constantFrom(-1 as const, 0 as const, 1 as const) }),
  ];
  if (library) ops.push(fc.record({ op: fc.constant('back' as const), ms: fc.integer({ min: 1, max: 60_000 }) }));
  return fc.record({
    library: fc.constant(library),
    limits: fc.array(fc.integer({ min: 1, max: 4 }), { minLength: SLOT_KEYS, maxLength: SLOT_KEYS }),
    leases: fc.array(fc.integer(LEASE), { minLength: SLOT_KEYS, maxLength: SLOT_KEYS }),
    ops: fc.array(fc.oneof(...ops), { minLength: 1, maxLength: 40, size: 'max' }),
  });
}

export interface SlotCheckOptions {
  /**
   * The library's stores: `inFlight` and `released` exactly as they keep ended slots (the model's `most`,
   * `tightest`), and a refusal's `waitMs` more than 0.
   */
  tightest?: boolean;
  /** `waitMs` exactly the ms until the earliest lease ends (the memory store). */
  exactWait?: boolean;
  /** A name for the store in a mismatch's report. */
  lane?: string;
  /** Called after every call with the key it used and the model (a test of the stored state). */
  afterCall?: (key: string, model: SlotModel, step: number) => Promise<void>;
}

/** What a run of sequences reached, to judge whether the draws say something. */
export interface SlotTotals {
  held: number;
  refused: number;
  renewed: number;
  /** Renewals of a slot whose lease had ended (not yet dropped). */
  renewedEnded: number;
  /** Takes that dropped ended slots to make room. */
  dropped: number;
  released: number;
  /** Give-backs that freed nothing: twice, a stranger, a dropped slot. */
  notReleased: number;
  /** Answers where the contract allows a range (ended slots counted or not). */
  ranged: number;
}

export function noSlotTotals(): SlotTotals {
  return { held: 0, refused: 0, renewed: 0, renewedEnded: 0, dropped: 0, released: 0, notReleased: 0, ranged: 0 };
}

function within(value: unknown, range: SlotRange): boolean {
  return typeof value === 'number' && Number.isInteger(value) && value >= range.least && value <= range.most;
}

/** Runs one sequence against `store`, keys `keys` (SLOT_KEYS of them, empty), comparing every answer with the model. */
export async function runSlotScenario(
  store: SlotStore,
  scenario: SlotScenario,
  keys: readonly string[],
  options: SlotCheckOptions = {},
  totals: SlotTotals = noSlotTotals(),
): Promise<SlotModel> {
  const model = new SlotModel();
  const lane = options.lane ?? 'store';
  let now = T0;
  const pick = (k: number, n: number): string | undefined => {
    const holders = model.holders(keys[k]);
    return holders.length === 0 ? undefined : holders[n % holders.length];
  };

  const take = async (step: number, k: number, holder: string, lease: LeasePick, limit = scenario.limits[k]) => {
    const request = { key: keys[k], limit, holder, leaseMs: 'ms' in lease ? lease.ms : scenario.leases[k] };
    const before = model.endOf(request.key, holder);
    const answer = await store.takeSlot(request, { now });
    const expected = model.take(request, now);
    compareTake(lane, step, options, { request, now, answer, expected });
    if (expected.held) totals.held++;
    else totals.refused++;
    if (expected.renewal) totals.renewed++;
    if (before !== undefined && before <= now) totals.renewedEnded++;
    if (expected.dropped > 0) totals.dropped++;
    if (expected.inFlight.least < expected.inFlight.most) totals.ranged++;
    await options.afterCall?.(request.key, model, step);
  };

  const giveBack = async (step: number, k: number, holder: string) => {
    const answer = await store.giveBackSlot(keys[k], holder);
    const expected = model.giveBack(keys[k], holder, now);
    compareRelease(lane, step, options, { key: keys[k], holder, now, answer, expected });
    if (expected.tightest) totals.released++;
    else totals.notReleased++;
    if (expected.released === 'either' || expected.inFlight.least < expected.inFlight.most) totals.ranged++;
    await options.afterCall?.(keys[k], model, step);
  };

  for (let step = 0; step < scenario.ops.length; step++) {
    const op = scenario.ops[step];
    switch (op.op) {
      case 'advance':
        now += op.ms;
        break;
      case 'back':
        now -= op.ms;
        break;
      case 'toEnd': {
        const holder = pick(op.k, op.pick);
        if (holder === undefined) break;
        const target = model.endOf(keys[op.k], holder)! + op.delta;
        if (target >= now || scenario.library) now = target;
        break;
      }
      case 'take':
        await take(step, op.k, `h${op.h}`, op.lease, op.limit);
        break;
      case 'renew':
        await take(step, op.k, pick(op.k, op.pick) ?? 'h0', op.lease);
        break;
      case 'giveBack': {
        const holder = pick(op.k, op.pick);
        if (holder === undefined) break;
        await giveBack(step, op.k, holder);
        if (op.twice) await giveBack(step, op.k, holder);
        break;
      }
      case 'stranger':
        await giveBack(step, op.k, STRANGER);
        break;
    }
  }
  return model;
}

function compareTake(
  lane: string,
  step: number,
  options: SlotCheckOptions,
  call: { request: object; now: number; answer: SlotAnswer; expected: ModelSlotAnswer },
): void {
  const { answer, expected } = call;
  const detail = () => ({ lane, step, ...call });
  if (typeof answer !== 'object' || answer === null || typeof answer.held !== 'boolean')
    fail('a slot take answered no { held, inFlight, waitMs }', detail());
  if (answer.held !== expected.held)
    fail(expected.held ? 'a slot take was refused with room (rule 1)' : 'a slot take was held beyond the limit (rule 1)', detail());
  const inFlight = options.tightest ? { least: expected.inFlight.most, most: expected.inFlight.most } : expected.inFlight;
  if (!within(answer.inFlight, inFlight)) fail("a slot take's inFlight differs from the model", detail());
  // Refused: at most until the earliest lease ends; 0 is allowed as 'unknown', but not from the library's stores.
  const least = options.tightest ? Number.MIN_VALUE : 0;
  if (expected.held ? answer.waitMs !== 0 : !(answer.waitMs >= least && answer.waitMs <= expected.waitMs))
    fail("a slot take's waitMs is not within the model's (0 when held, else at most the earliest lease's end)", detail());
  if (options.exactWait && answer.waitMs !== expected.waitMs) fail("a slot take's waitMs differs from the model", detail());
}

function compareRelease(
  lane: string,
  step: number,
  options: SlotCheckOptions,
  call: { key: string; holder: string; now: number; answer: SlotRelease; expected: ModelSlotRelease },
): void {
  const { answer, expected } = call;
  const detail = () => ({ lane, step, ...call });
  if (typeof answer !== 'object' || answer === null || typeof answer.released !== 'boolean')
    fail('a slot give-back answered no { released, inFlight }', detail());
  const released = options.tightest ? expected.tightest : expected.released;
  if (released !== 'either' && answer.released !== released)
    fail(
      released ? "a give-back did not free its holder's slot (rule 3)" : 'a give-back freed a slot its holder did not have (rule 3)',
      detail(),
    );
  const inFlight = options.tightest ? { least: expected.inFlight.most, most: expected.inFlight.most } : expected.inFlight;
  if (!within(answer.inFlight, inFlight)) fail("a slot give-back's inFlight differs from the model", detail());
}
