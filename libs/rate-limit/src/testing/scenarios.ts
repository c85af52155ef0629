import fc from 'fast-check';
import type { ModelPolicy } from './bucket-model.js';

/**
 * What the model-based property test draws (the comparison of a store's reply with the model's is in compare.ts):
 * shared by `verifyBucketStore` (any store, through its interface) and the repository's own test of the
 * Lua script and the memory store (test/properties/model/, which also reads their stored state and damages it).
 * The arbitraries are kept as they were drawn before they moved here, so a seed replays the same sequences.
 */

/** The simulated store clock starts here (ms). */
export const T0 = 1_750_000_000_000;
/** The simulated store clock stays within this range (PEXPIRE and '%.17g' stay exact far beyond it). */
export const MAX_NOW = 6e15;
const MAX_CAPACITY = 1e12;
const MAX_WINDOW_SECONDS = 1e12;
/** Keys per sequence. */
export const KEYS = 3;

// ---------------------------------------------------------------------------------------------------
// What fast-check draws

export type CostPick =
  | { kind: 'one' }
  | { kind: 'zero' }
  | { kind: 'full' }
  | { kind: 'over' }
  | { kind: 'part'; f: number }
  /** floor(tokens the model holds now) + delta: probes the drain boundary at every scale. */
  | { kind: 'edge'; delta: -1 | 0 | 1 };

/**
 * A priority's floor (`BucketRequest.floor`): a `share` of the capacity (what a policy's `reserve` makes),
 * or the tokens the model holds now less the cost, plus `delta` (probes `tokens - floor >= cost` exactly).
 */
export type FloorPick = { share: number } | { edge: -1 | 0 | 1 };

export interface Bucket {
  k: number;
  cost: CostPick;
  /** Drawn only with priorities (`scenarioArb`'s third argument); absent: no floor. */
  floor?: FloorPick;
  /** -1: the key's own policy; 0 or 1: one of two other policies (another caller on the same bucket). */
  alt: number;
}

/** Damage written into a stored field: `part` of the capacity, a `value`, `rel` ms from now, or negative tokens. */
export type Damage =
  | 'nan'
  | 'inf'
  | '-inf'
  | 'text'
  | { part: number }
  | { value: number }
  | { rel: number }
  | { neg: 'lowest' | 'below-lowest' | 'half' | 'huge' };

export type Op =
  | { op: 'take' | 'peek' | 'refund'; buckets: Bucket[] }
  | { op: 'reset'; k: number; remote: boolean }
  | { op: 'advance'; ms: number }
  | { op: 'step'; ms: number }
  | { op: 'corrupt'; k: number; tokens?: Damage; ts?: Damage; b?: Damage; w?: Damage }
  /**
   * A reservation (acquire) of key k with its own policy (without its penalty): the call's longest wait is
   * `maxWait` of the longest wait any call may have, `boundMs` (bounded by `reservationBound`).
   */
  | { op: 'reserve'; k: number; cost: CostPick; boundMs: number; maxWait: number }
  /** The last reservation of key k still held is given back (an aborted wait: a refund of its cost). */
  | { op: 'abort'; k: number };

export interface Scenario {
  policies: ModelPolicy[];
  alternatives: ModelPolicy[];
  ops: Op[];
}

const exponent = (min: number, max: number) => fc.double({ min, max, noNaN: true, noDefaultInfinity: true });

/** The smallest refill the window bound accepts for capacity `capacity` (B/R <= 1e12 s). */
function slowestRefill(capacity: number): number {
  let rate = capacity / MAX_WINDOW_SECONDS;
  while (!(capacity / rate <= MAX_WINDOW_SECONDS)) rate *= 1 + Number.EPSILON;
  return rate;
}

const capacityArb = fc.oneof(
  { weight: 2, arbitrary: fc.constant(1) },
  { weight: 3, arbitrary: fc.integer({ min: 1, max: 10 }) },
  { weight: 3, arbitrary: exponent(0, 12).map((e) => Math.min(MAX_CAPACITY, Math.max(1, Math.floor(10 ** e)))) },
  { weight: 2, arbitrary: fc.constantFrom(MAX_CAPACITY, MAX_CAPACITY - 1, 2 ** 39 + 1) },
);

function refillArb(capacity: number): fc.Arbitrary<number> {
  const slowest = slowestRefill(capacity);
  const accepted = (rate: number) => (rate > 0 && Number.isFinite(rate) && capacity / rate <= MAX_WINDOW_SECONDS ? rate : slowest);
  return fc.oneof(
    { weight: 1, arbitrary: fc.constant(slowest) },
    { weight: 4, arbitrary: exponent(Math.log10(slowest), 12).map((e) => accepted(10 ** e)) },
    { weight: 3, arbitrary: fc.constantFrom(1 / 86_400, 0.25, 1, 7, 1000, 1e6, 1e300, Number.MAX_VALUE).map(accepted) },
    { weight: 1, arbitrary: exponent(12, 308).map((e) => accepted(10 ** e)) },
  );
}

/** blockSeconds: none most of the time, else from 0 (exclusive) to the bounds (<= 1e12 s, × R <= 1e12 tokens). */
function blockArb(rate: number): fc.Arbitrary<number | undefined> {
  let most = Math.min(MAX_WINDOW_SECONDS, MAX_CAPACITY / rate);
  while (most * rate > MAX_CAPACITY) most *= 1 - Number.EPSILON;
  const withinBound = (block: number) => (block > 0 && block <= most ? block : most);
  return fc.oneof(
    { weight: 5, arbitrary: fc.constant(undefined) },
    { weight: 1, arbitrary: fc.constant(most) },
    { weight: 2, arbitrary: exponent(-9, 0).map((u) => withinBound(most * 10 ** u)) },
    { weight: 2, arbitrary: fc.constantFrom(0.5, 1, 30).map(withinBound) },
  );
}

/** A penalty's cost (issue 22): the request's (undefined), 1 (a cost computed per request), 0, or a fixed cost up to the capacity. */
function penaltyCostArb(capacity: number): fc.Arbitrary<number | undefined> {
  return fc.oneof(
    { weight: 3, arbitrary: fc.constant(undefined) },
    { weight: 2, arbitrary: fc.constantFrom(0, 1) },
    { weight: 1, arbitrary: fc.double({ min: 0, max: 1, noNaN: true }).map((f) => Math.floor(f * capacity)) },
  );
}

const policyArb: fc.Arbitrary<ModelPolicy> = capacityArb.chain((capacity) =>
  refillArb(capacity).chain((refillPerSecond) =>
    fc.tuple(blockArb(refillPerSecond), penaltyCostArb(capacity)).map(([blockSeconds, penaltyCost]) => {
      if (blockSeconds === undefined) return { capacity, refillPerSecond };
      return penaltyCost === undefined
        ? { capacity, refillPerSecond, blockSeconds }
        : { capacity, refillPerSecond, blockSeconds, penaltyCost };
    }),
  ),
);

const costArb: fc.Arbitrary<CostPick> = fc.oneof(
  { weight: 4, arbitrary: fc.constant({ kind: 'one' as const }) },
  { weight: 1, arbitrary: fc.constant({ kind: 'zero' as const }) },
  { weight: 2, arbitrary: fc.constant({ kind: 'full' as const }) },
  { weight: 1, arbitrary: fc.constant({ kind: 'over' as const }) },
  { weight: 3, arbitrary: fc.double({ min: 0, max: 1, noNaN: true }).map((f) => ({ kind: 'part' as const, f })) },
  { weight: 5, arbitrary: fc.constantFrom(-1, 0, 1).map((delta) => ({ kind: 'edge' as const, delta: delta as -1 | 0 | 1 })) },
);

const bucketsArb: fc.Arbitrary<Bucket[]> = fc.uniqueArray(
  fc.record({
    k: fc.integer({ min: 0, max: KEYS - 1 }),
    cost: costArb,
    alt: fc.oneof({ weight: 12, arbitrary: fc.constant(-1) }, { weight: 1, arbitrary: fc.integer({ min: 0, max: 1 }) }),
  }),
  { minLength: 1, maxLength: KEYS, selector: (bucket) => bucket.k },
);

const floorArb: fc.Arbitrary<FloorPick | undefined> = fc.oneof(
  { weight: 2, arbitrary: fc.constant(undefined) },
  { weight: 2, arbitrary: fc.constantFrom(0, 0.2, 0.5, 0.999).map((share) => ({ share })) },
  { weight: 2, arbitrary: fc.double({ min: 0, max: 1, maxExcluded: true, noNaN: true }).map((share) => ({ share })) },
  { weight: 4, arbitrary: fc.constantFrom(-1, 0, 1).map((delta) => ({ edge: delta as -1 | 0 | 1 })) },
);

/** The buckets of a decision with priorities: each may carry a floor (a request at a level with a reserve). */
const flooredBucketsArb: fc.Arbitrary<Bucket[]> = fc.uniqueArray(
  fc
    .record({
      k: fc.integer({ min: 0, max: KEYS - 1 }),
      cost: costArb,
      alt: fc.oneof({ weight: 12, arbitrary: fc.constant(-1) }, { weight: 1, arbitrary: fc.integer({ min: 0, max: 1 }) }),
      floor: floorArb,
    })
    .map(({ floor, ...bucket }) => (floor === undefined ? bucket : { ...bucket, floor })),
  { minLength: 1, maxLength: KEYS, selector: (bucket) => bucket.k },
);

const msArb = fc.oneof(
  fc.constantFrom(0, 1, 2, 999, 1000, 1001),
  fc.integer({ min: 0, max: 5000 }),
  exponent(0, 13).map((e) => Math.floor(10 ** e)),
);

const stepArb = fc.oneof(
  fc.integer({ min: -999, max: -1 }),
  fc.constantFrom(-1000, -1001, -3_600_000, -1e12, 3_600_000, 1e12),
  fc.integer({ min: 1, max: 5000 }),
  exponent(0, 12).map((e) => -Math.floor(10 ** e)),
);

const tokensDamageArb: fc.Arbitrary<Damage> = fc.oneof(
  fc.constantFrom<Damage>('nan', 'inf', '-inf', 'text'),
  fc.constantFrom<Damage>({ neg: 'lowest' }, { neg: 'below-lowest' }, { neg: 'half' }, { neg: 'huge' }, { value: 1e300 }, { value: 0 }),
  fc.double({ min: 0, max: 1, noNaN: true }).map((f) => ({ part: f })),
);

const tsDamageArb: fc.Arbitrary<Damage> = fc.oneof(
  fc.constantFrom<Damage>('nan', 'inf', '-inf', 'text'),
  fc.constantFrom(-1e12, -5000, 0, 500, 999, 1000, 1001, 1500, 3_600_000, 1e12).map((rel) => ({ rel })),
);

const penaltyEndDamageArb: fc.Arbitrary<Damage> = fc.oneof(
  fc.constantFrom<Damage>('nan', 'text'),
  fc.constantFrom(-1000, 0, 1, 30_000, 1e12).map((rel) => ({ rel })),
);

const reserveArb: fc.Arbitrary<Op> = fc.record({
  op: fc.constant('reserve' as const),
  k: fc.integer({ min: 0, max: KEYS - 1 }),
  cost: costArb,
  boundMs: fc.constantFrom(0, 1, 1000, 60_000, 60_000, 3_600_000, 1e12, 1e12),
  maxWait: fc.oneof(
    { weight: 3, arbitrary: fc.constant(1) },
    { weight: 1, arbitrary: fc.constant(0) },
    { weight: 2, arbitrary: fc.double({ min: 0, max: 1, noNaN: true }) },
  ),
});

const reservedDamageArb: fc.Arbitrary<Damage> = fc.constantFrom<Damage>(
  'nan',
  'inf',
  'text',
  { value: 0 },
  { value: -1 },
  { value: 1 },
  {
    value: 60_000,
  },
);

/**
 * The longest wait any call may have, as `BucketService` bounds it for a policy: at most 1e15 ms, with
 * what refills within it at most 1e12 tokens (the script refuses more).
 */
export function reservationBound(boundMs: number, refillPerSecond: number): number {
  let bound = Math.min(boundMs, MAX_WINDOW_SECONDS * 1000);
  while (!((bound * refillPerSecond) / 1000 <= MAX_CAPACITY)) bound = Math.floor(((MAX_CAPACITY * 1000) / refillPerSecond) * (1 - 1e-9));
  return bound;
}

/** The call's longest wait: `maxWait` of `bound`, as a whole number of ms. */
export function reservationWait(maxWait: number, bound: number): number {
  return maxWait === 1 ? bound : Math.floor(maxWait * bound);
}

/**
 * The operations of a sequence; `damage`: also damage written into a stored bucket (only a lane that can
 * reach its state); `reservations`: also reservations and their give-backs (acquire and an aborted wait).
 */
function opArb(damage: boolean, reservations = false, priorities = false): fc.Arbitrary<Op> {
  const decided = priorities ? flooredBucketsArb : bucketsArb;
  const ops: fc.WeightedArbitrary<Op>[] = [
    { weight: 12, arbitrary: decided.map((buckets) => ({ op: 'take' as const, buckets })) },
    { weight: 2, arbitrary: decided.map((buckets) => ({ op: 'peek' as const, buckets })) },
    { weight: 2, arbitrary: decided.map((buckets) => ({ op: 'refund' as const, buckets })) },
    {
      weight: 1,
      arbitrary: fc.record({ op: fc.constant('reset' as const), k: fc.integer({ min: 0, max: KEYS - 1 }), remote: fc.boolean() }),
    },
    { weight: 7, arbitrary: msArb.map((ms) => ({ op: 'advance' as const, ms })) },
    { weight: 2, arbitrary: stepArb.map((ms) => ({ op: 'step' as const, ms })) },
  ];
  if (damage) {
    ops.push({
      weight: 2,
      arbitrary: fc
        .record(
          { k: fc.integer({ min: 0, max: KEYS - 1 }), tokens: tokensDamageArb, ts: tsDamageArb, b: penaltyEndDamageArb },
          { requiredKeys: ['k'] },
        )
        .filter((d) => d.tokens !== undefined || d.ts !== undefined || d.b !== undefined)
        .map((d) => ({ op: 'corrupt' as const, ...d })),
    });
  }
  if (reservations) {
    ops.push({ weight: 8, arbitrary: reserveArb });
    ops.push({ weight: 3, arbitrary: fc.integer({ min: 0, max: KEYS - 1 }).map((k) => ({ op: 'abort' as const, k })) });
    if (damage) {
      ops.push({
        weight: 1,
        arbitrary: fc
          .record({ k: fc.integer({ min: 0, max: KEYS - 1 }), w: reservedDamageArb, tokens: tokensDamageArb }, { requiredKeys: ['k', 'w'] })
          .map((d) => ({ op: 'corrupt' as const, ...d })),
      });
    }
  }
  return fc.oneof(...ops);
}

/**
 * Sequences of up to 60 operations over KEYS keys, each with its policy, and two other policies that
 * sometimes use the same buckets; `reservations`: with reservations and aborted waits among them;
 * `priorities`: takes, peeks and refunds whose buckets may carry a floor (without it, the draws of a
 * seed are what they always were).
 */
export function scenarioArb(damage: boolean, reservations = false, priorities = false): fc.Arbitrary<Scenario> {
  return fc.record({
    policies: fc.array(policyArb, { minLength: KEYS, maxLength: KEYS }),
    alternatives: fc.array(policyArb, { minLength: 2, maxLength: 2 }),
    ops: fc.array(opArb(damage, reservations, priorities), { minLength: 1, maxLength: 60, size: 'max' }),
  });
}
