import fc from 'fast-check';
import { Redis } from 'ioredis';
import { MemoryBucketStore, RedisBucketStore } from 'nest-redis-rate-limit';
import { DenyCache } from '../../../libs/rate-limit/src/engine/deny-cache.js';
import type { BucketRequest, PenaltyReport } from '../../../libs/rate-limit/src/stores/token-bucket.js';
import type { TakeResult } from '../../../libs/rate-limit/src/stores/bucket-store.interface.js';
import {
  BucketModel,
  type ModelEntry,
  type ModelMode,
  type ModelOutcome,
  type ModelPolicy,
  type ModelRequest,
  type ModelMark,
  modelTtlMs,
} from '../../../libs/rate-limit/src/testing/bucket-model.js';
import type { DecisionExtra } from '../../../libs/rate-limit/src/stores/redis/lua/script-codec.js';
import {
  type Damage,
  KEYS,
  MAX_NOW,
  reservationBound,
  reservationWait,
  type Scenario,
  scenarioArb,
  T0,
} from '../../../libs/rate-limit/src/testing/scenarios.js';
import { checkFloors, close, compareResult, fail, resolveCost, resolveFloor } from '../../../libs/rate-limit/src/testing/compare.js';
import { deleteKeys, redisUrl, testPrefix } from '../../support/redis.js';

/**
 * Property-based test against a model (issue 10, item 8). fast-check draws policies (capacity 1 to
 * 1e12, refill from the slowest the window bound accepts to Number.MAX_VALUE per second, penalties
 * sometimes) and sequences of take / peek / refund / reset over up to three keys, clock advances,
 * steps of the store's clock forward and back, and damage written straight into the stored bucket.
 * Every sequence runs through the Lua script (real Redis, the test-only `now` argument) and through
 * the memory store, and after every step both are compared with `BucketModel`
 * (libs/rate-limit/src/testing/bucket-model.ts, written from DESIGN.md and the README, sharing no code
 * with the library; the draws and the comparison of replies are libs/rate-limit/src/testing/scenarios.ts,
 * which `verifyBucketStore` of `nest-redis-rate-limit/testing` runs against any store):
 *
 * - allowed/denied exactly; tokens (reply and stored) within 1e-9 × max(1, |model|): relative from one
 *   token up, absolute below (fractions of a token after a tiny refill). 1e-9 relative would hide a lost
 *   whole token at 1e12, so costs are also drawn from the model's current tokens (floor(t) - 1, floor(t),
 *   floor(t) + 1): a bucket that drained one token too many or too few is then allowed or denied
 *   differently, which must match exactly;
 * - stamps exactly, penalty ends, the hash fields present (no partial write), the TTL the script set
 *   (PTTL) and the memory store's expiry;
 * - headers (`toDecision`) finite non-negative integers;
 * - the deny cache (public API, as BucketService drives it: deny before a take, learn the store's
 *   answer unless it denied, forget before and after a local reset or a refund) never denies a take the model allows, and its bound is
 *   never below the model's tokens, except where the README documents the damage: for one window
 *   (B/R + blockSeconds) after the store's clock steps forward, a reset on another instance, damage
 *   written into the bucket, or the bucket used with another policy.
 *
 * Time. The store's clock `now` (Redis TIME) and this process' monotonic clock (the deny cache's) are
 * separate: an advance moves both, a step moves only the store's. Redis counts TTLs in real time while
 * these tests count `now` in simulated time, so the harness simulates expiry: the model expires keys
 * on the simulated clock, the harness deletes those from Redis before a call, checks the PTTL each call
 * sets, then lengthens it to an hour (PEXPIRE GT, so a key with no TTL keeps none). A key whose TTL is
 * shorter than the call took in real time (a tiny window: 1 ms at B/R = 0.5 ms) may be gone before the
 * check; it is written back from the model.
 *
 * Damage is written as a user at redis-cli would (HSET: a new key gets no TTL) and into the memory
 * store's own map (a new entry gets the idle TTL: that store has no key without one); a penalty end
 * `b` alone is only written into an existing bucket.
 *
 * `npm test` runs MODEL_RUNS (default below) sequences from a fixed seed, a third as many from a
 * second fixed seed and from a seed drawn for the run (`SEEDS`); MODEL_RUNS=10000 (and MODEL_SEED=<n>)
 * for a long run, MODEL_VERBOSE=1 to print what the runs reached.
 */

const RUNS = Number(process.env.MODEL_RUNS ?? 300);
/**
 * The sequences `npm test` runs: the fixed seed the suite has always run (RUNS of them), a second fixed
 * seed, and a seed drawn anew each run (printed in the test's name and in a failure, so that a failing
 * draw can be run again with MODEL_SEED=<n>). MODEL_SEED runs that seed alone.
 */
const SEEDS: { seed: number; runs: number; drawn?: true }[] =
  process.env.MODEL_SEED !== undefined
    ? [{ seed: Number(process.env.MODEL_SEED), runs: RUNS }]
    : [
        { seed: 1_008_010, runs: RUNS },
        { seed: 20_261_204, runs: Math.ceil(RUNS / 3) },
        // A drawn seed that failed (2026-12-05) at its 33rd sequence: a bucket below -capacity by another
        // policy's penalty was denied by the deny cache after that penalty ended (the store repairs it to 0).
        { seed: 933_119_426, runs: RUNS },
        { seed: Math.floor(Math.random() * 2 ** 31), runs: Math.ceil(RUNS / 3), drawn: true },
      ];
/** Real TTL given to every key that has one, after its PTTL was checked: the simulated clock decides expiry. */
const REAL_TTL_MS = 3_600_000;
/** Added to the simulated TTL left before each call, so that no key runs out in real time during it. */
const SLACK_MS = 100;

// ---------------------------------------------------------------------------------------------------
// The two implementations, each beside its own model

/** A stored field as Lua's tonumber reads it ('nan', 'inf', '-inf' through strtod; text: not a number). */
function storedNumber(value: unknown): number | undefined {
  if (value === undefined) return undefined;
  if (typeof value === 'number') return value;
  const text = String(value).trim().toLowerCase();
  if (text === 'inf' || text === 'infinity') return Infinity;
  if (text === '-inf' || text === '-infinity') return -Infinity;
  if (text === '' || text === 'nan' || text === '-nan') return NaN;
  return Number(text);
}

function sameField(actual: number | undefined, expected: number | undefined): boolean {
  if (actual === undefined || expected === undefined) return actual === expected;
  if (Number.isNaN(expected)) return Number.isNaN(actual);
  return close(actual, expected);
}

/** A damaged value, as written into Redis (a string) and into the memory store (a number, or text as is). */
interface Written {
  model: number;
  redis: string;
  memory: number | string;
}

function damage(value: Damage, now: number, policy: ModelPolicy): Written {
  if (value === 'nan') return { model: NaN, redis: 'nan', memory: NaN };
  if (value === 'inf') return { model: Infinity, redis: 'inf', memory: Infinity };
  if (value === '-inf') return { model: -Infinity, redis: '-inf', memory: -Infinity };
  if (value === 'text') return { model: NaN, redis: 'lots', memory: 'lots' };
  let x: number;
  if ('rel' in value) x = now + value.rel;
  else if ('neg' in value) {
    const lowest = -((policy.blockSeconds ?? 0) * policy.refillPerSecond);
    x = value.neg === 'lowest' ? lowest : value.neg === 'below-lowest' ? lowest - 1 : value.neg === 'half' ? -0.5 : -1e300;
  } else if ('part' in value) x = Math.floor(value.part * policy.capacity * 1000) / 1000;
  else x = value.value;
  return { model: x, redis: String(x), memory: x };
}

interface StoredBucket {
  tokens?: number | string;
  ts?: number | string;
  expiresAt?: number;
  blockedUntil?: number | string;
  w?: number | string;
  d?: number | string;
}

interface Lane {
  readonly name: string;
  readonly model: BucketModel;
  /** Runs one call, compares it with the model; answers the implementation's result. */
  call(
    requests: ModelRequest[],
    mode: ModelMode,
    now: number,
    step: number,
    reserve?: Reserve,
    mark?: ModelMark,
  ): Promise<TakeResult & PenaltyReport>;
  reset(key: string): Promise<void>;
  corrupt(key: string, fields: Record<Field, Written | undefined>, now: number, policy: ModelPolicy): Promise<void>;
}

type Field = 'tokens' | 'ts' | 'b' | 'w' | 'd';
const FIELDS = ['b', 'd', 'tokens', 'ts', 'w'] as const;

/** A reservation's numbers (acquire): the call's longest wait and the longest wait of any call, in ms. */
interface Reserve {
  maxWaitMs: number;
  boundMs: number;
}

/** The model's answer to a call: a decision, or a reservation (whose wait must match exactly). */
function expectedOf(
  model: BucketModel,
  requests: ModelRequest[],
  mode: ModelMode,
  now: number,
  reserve: Reserve | undefined,
  mark?: ModelMark,
): ModelOutcome & { waitMs?: number } {
  if (reserve === undefined) return model.decide(requests, mode, now, false, mark);
  const r = model.reserve(requests[0], reserve.maxWaitMs, reserve.boundMs, now);
  return {
    allowed: r.allowed,
    tokens: [r.tokens],
    ttlSet: [r.ttlSet],
    written: [r.ttlSet !== undefined],
    running: [false],
    waitMs: r.waitMs,
  };
}

/** A reservation's wait must be the model's, and its clock the call's (the script answers it as an integer reply). */
function compareWait(lane: string, step: number, result: TakeResult, expected: { waitMs?: number }, now: number): void {
  if (result.waitMs !== expected.waitMs) fail('the wait of a reservation differs from the model', { lane, step, result, expected });
  if (expected.waitMs !== undefined && result.nowMs !== Math.trunc(now) && result.nowMs !== now)
    fail("a reservation's now is not the call's", { lane, step, result, now });
}

class MemoryLane implements Lane {
  readonly name = 'memory';
  readonly model = new BucketModel();
  private readonly store = new MemoryBucketStore();
  /** The store's own map: the test writes damage into it as it would into a Redis hash. */
  private readonly buckets = (this.store as unknown as { buckets: Map<string, StoredBucket> }).buckets;

  async call(
    requests: ModelRequest[],
    mode: ModelMode,
    now: number,
    step: number,
    reserve?: Reserve,
    mark?: ModelMark,
  ): Promise<TakeResult & PenaltyReport> {
    const result = await this.store.take(
      requests,
      reserve ? { now, reserve } : { now, dryRun: mode === 'peek', refund: mode === 'refund', givesBack: mark },
    );
    const expected = expectedOf(this.model, requests, mode, now, reserve, mark);
    compareResult(this.name, step, result, expected, requests);
    compareWait(this.name, step, result, expected, now);
    for (const request of requests) this.compareState(request.key, step);
    return result;
  }

  async reset(key: string): Promise<void> {
    await this.store.delete([key]);
    this.model.delete(key);
  }

  async corrupt(key: string, fields: Record<Field, Written | undefined>, now: number, policy: ModelPolicy): Promise<void> {
    // A bucket the store holds always has an expiry; one created by hand gets the idle TTL.
    const expiresAt = now + modelTtlMs(policy, 0);
    if (this.model.expired(key, now)) this.buckets.delete(key);
    this.model.corrupt(key, pick(fields, 'model'), now, expiresAt);
    const bucket = this.buckets.get(key) ?? { expiresAt };
    if (fields.tokens) bucket.tokens = fields.tokens.memory;
    if (fields.ts) bucket.ts = fields.ts.memory;
    if (fields.b) bucket.blockedUntil = fields.b.memory;
    if (fields.w) bucket.w = fields.w.memory;
    if (fields.d) bucket.d = fields.d.memory;
    this.buckets.set(key, bucket);
  }

  private compareState(key: string, step: number): void {
    const stored = this.buckets.get(key);
    const expected = this.model.entries.get(key);
    const detail = { lane: this.name, step, key, stored, expected };
    if (expected === undefined || stored === undefined) {
      if (expected !== stored) fail('stored bucket differs from the model', detail);
      return;
    }
    const same =
      sameField(storedNumber(stored.tokens), expected.tokens) &&
      sameField(storedNumber(stored.ts), expected.ts) &&
      sameField(storedNumber(stored.blockedUntil), expected.b) &&
      sameField(storedNumber(stored.w), expected.w) &&
      sameField(storedNumber(stored.d), expected.d) &&
      (expected.expiresAt === undefined || Math.abs((stored.expiresAt ?? NaN) - expected.expiresAt) <= 1);
    if (!same) fail('stored bucket differs from the model', detail);
  }
}

function pick(fields: Record<Field, Written | undefined>, side: 'model'): Partial<Pick<ModelEntry, Field>> {
  const out: Partial<Pick<ModelEntry, Field>> = {};
  for (const field of FIELDS) if (fields[field]) out[field] = fields[field]![side];
  return out;
}

class RedisLane implements Lane {
  readonly model = new BucketModel();
  /** Keys that expired in real time (a TTL shorter than the call) and were written back from the model. */
  restored = 0;

  constructor(
    protected readonly client: Redis,
    protected readonly store: RedisBucketStore,
    readonly name = 'lua',
  ) {}

  /** The store call under test: a decision alone (the fast path for one bucket without penalty), a reservation or a give-back. */
  protected decide(
    requests: ModelRequest[],
    mode: ModelMode,
    now: number,
    _step: number,
    extra: DecisionExtra | undefined,
  ): Promise<TakeResult & PenaltyReport> {
    if (extra?.reserve) return this.store.take(requests, { now, reserve: extra.reserve });
    return this.store.take(requests, { now, dryRun: mode === 'peek', refund: mode === 'refund', givesBack: extra?.givesBack });
  }

  async call(
    requests: ModelRequest[],
    mode: ModelMode,
    now: number,
    step: number,
    reserve?: Reserve,
    mark?: ModelMark,
  ): Promise<TakeResult & PenaltyReport> {
    // Expiry on the simulated clock: what the model says has expired is deleted first.
    const expired = requests.filter((r) => this.model.expired(r.key, now)).map((r) => r.key);
    if (expired.length > 0) await this.client.del(...expired);
    // The simulated TTL each key has left (plus SLACK_MS, so that none runs out in real time during the
    // call): a call must lengthen it or leave it, never shorten it (issue 22).
    const before = this.client.multi();
    for (const { key } of requests) {
      const expiresAt = this.model.entries.get(key)?.expiresAt;
      if (expiresAt !== undefined) before.pexpire(key, expiresAt - now + SLACK_MS);
    }
    // Real TTLs run from when Redis ran these PEXPIREs: the event loop may resume long after (a busy machine).
    const beforeSent = performance.now();
    await before.exec();
    const started = performance.now();
    const extra = reserve ? { reserve } : mark ? { givesBack: mark } : undefined;
    const result = await this.decide(requests, mode, now, step, extra);
    const expected = expectedOf(this.model, requests, mode, now, reserve, mark);
    compareResult(this.name, step, result, expected, requests);
    compareWait(this.name, step, result, expected, now);
    // The state as written: fields, the TTL this call set, then an hour of real TTL for keys that have one.
    const multi = this.client.multi();
    for (const { key } of requests) multi.hgetall(key).pttl(key).pexpire(key, REAL_TTL_MS, 'GT');
    const replies = (await multi.exec()) ?? [];
    const elapsed = performance.now() - started;
    for (let i = 0; i < requests.length; i++) {
      const key = requests[i].key;
      const hash = replies[3 * i][1] as Record<string, string>;
      const pttl = replies[3 * i + 1][1] as number;
      const entry = this.model.entries.get(key);
      const ttlSet = expected.ttlSet[i];
      const detail = { lane: this.name, step, key, hash, pttl, entry, ttlSet, elapsed };
      if (entry === undefined) {
        if (pttl !== -2) fail('a key the model does not have', detail);
        continue;
      }
      if (pttl === -2) {
        // Gone in real time: only a TTL this call set and that was shorter than the call may do that.
        if (ttlSet === undefined || ttlSet > elapsed + 1) fail('a key the model has is missing', detail);
        await this.writeBack(key, entry);
        this.restored++;
        continue;
      }
      const fields = Object.keys(hash).sort().join(',');
      const wanted = FIELDS.filter((f) => entry[f] !== undefined).join(',');
      if (fields !== wanted) fail('hash fields differ from the model (a partial write?)', detail);
      if (
        !sameField(storedNumber(hash.tokens), entry.tokens) ||
        !sameField(storedNumber(hash.ts), entry.ts) ||
        !sameField(storedNumber(hash.b), entry.b) ||
        !sameField(storedNumber(hash.w), entry.w) ||
        !sameField(storedNumber(hash.d), entry.d)
      ) {
        fail('stored bucket differs from the model', detail);
      }
      if (ttlSet !== undefined) {
        // The model's expiry (the longer of what the key had and what this call asked), as set before the call.
        const left = entry.expiresAt! - now;
        // The TTL ran down since the PEXPIRE before the call (when the script kept it) or since the script.
        const sinceBefore = performance.now() - beforeSent;
        if (!(pttl <= left + SLACK_MS + 1 && pttl >= left - sinceBefore - 2))
          fail('the TTL the script set differs from the model', { ...detail, left, sinceBefore });
      } else if (entry.expiresAt === undefined) {
        if (pttl !== -1) fail('a TTL on a key the model has without one', detail);
      } else if (pttl < 0) {
        fail('a key without TTL that the model gave one', detail);
      }
    }
    return result;
  }

  async reset(key: string): Promise<void> {
    await this.store.delete([key]);
    this.model.delete(key);
  }

  async corrupt(key: string, fields: Record<Field, Written | undefined>, now: number): Promise<void> {
    if (this.model.expired(key, now)) await this.client.del(key);
    // HSET keeps the TTL of a key that has one; a key it creates has none.
    this.model.corrupt(key, pick(fields, 'model'), now, undefined);
    const args: string[] = [];
    for (const field of FIELDS) if (fields[field]) args.push(field, fields[field]!.redis);
    await this.client.hset(key, ...args);
  }

  private async writeBack(key: string, entry: ModelEntry): Promise<void> {
    const args: string[] = [];
    for (const field of FIELDS) if (entry[field] !== undefined) args.push(field, String(entry[field]));
    await this.client
      .multi()
      .hset(key, ...args)
      .pexpire(key, REAL_TTL_MS)
      .exec();
  }
}

type SharedDecision = { requests: readonly ModelRequest[]; mode: ModelMode; extra?: DecisionExtra };
type SharedDecide = (decisions: SharedDecision[], now: number) => Promise<((TakeResult & PenaltyReport) | Error)[]>;

/**
 * The same sequence through the script's shared call (what coalescing sends): each decision of the
 * sequence goes in one call after and before another decision on a key of its own, so the script's
 * per-call state (now printed once, the last TTL's text reused) carries over from one decision to the
 * next. The neighbours' policies alternate between the decision's own (same TTL text) and another one.
 * Its keys are the sequence's keys with a suffix, so it holds its own buckets beside the `lua` lane's.
 */
class SharedCallLane extends RedisLane {
  constructor(
    client: Redis,
    store: RedisBucketStore,
    private readonly neighbour: string,
    private readonly other: ModelPolicy,
  ) {
    super(client, store, 'lua-shared');
  }

  protected override async decide(
    requests: ModelRequest[],
    mode: ModelMode,
    now: number,
    step: number,
    extra: DecisionExtra | undefined,
  ): Promise<TakeResult & PenaltyReport> {
    const { key: _key, cost: _cost, ...own } = requests[0];
    const policy = step % 2 === 0 ? own : this.other;
    const before: SharedDecision = { requests: [{ key: this.neighbour, ...policy, cost: 0 }], mode: 'take' };
    const after: SharedDecision = {
      requests: [{ key: `${this.neighbour}:after`, ...policy, cost: 1 }],
      mode: step % 3 === 0 ? 'peek' : 'take',
    };
    const shared = (this.store as unknown as { decide: SharedDecide }).decide.bind(this.store);
    const results = await shared([before, { requests, mode, extra }, after], now);
    for (const result of results) if (result instanceof Error) throw result;
    return results[1] as TakeResult & PenaltyReport;
  }
}

/** A lane whose keys are another lane's with a suffix. */
class RenamedLane implements Lane {
  constructor(
    private readonly inner: Lane,
    private readonly suffix: string,
  ) {}

  get name(): string {
    return this.inner.name;
  }

  get model(): BucketModel {
    return this.inner.model;
  }

  call(
    requests: ModelRequest[],
    mode: ModelMode,
    now: number,
    step: number,
    reserve?: Reserve,
    mark?: ModelMark,
  ): Promise<TakeResult & PenaltyReport> {
    return this.inner.call(
      requests.map((r) => ({ ...r, key: r.key + this.suffix })),
      mode,
      now,
      step,
      reserve,
      mark,
    );
  }

  reset(key: string): Promise<void> {
    return this.inner.reset(key + this.suffix);
  }

  corrupt(key: string, fields: Record<Field, Written | undefined>, now: number, policy: ModelPolicy): Promise<void> {
    return this.inner.corrupt(key + this.suffix, fields, now, policy);
  }
}

// ---------------------------------------------------------------------------------------------------
// The deny cache beside the Redis lane

class DenyCacheCheck {
  /** This process' monotonic clock (ms): moves with advances, not with steps of the store's clock. */
  clock = 0;
  readonly cache = new DenyCache(undefined, () => this.clock);
  denials = 0;
  excused = 0;
  /** When (this process' clock) tokens may have appeared that the cache cannot see, per key. */
  private readonly unseen = new Map<string, number>();
  private forwardStep = -Infinity;
  private readonly lastPolicy = new Map<string, string>();

  /** A store call takes time: the answer arrives a microsecond after the request left. */
  tick(): void {
    this.clock += 0.001;
  }

  /** The store's clock stepped forward: every bucket got refill the cache's bound does not count. */
  steppedForward(): void {
    this.forwardStep = this.clock;
  }

  /** How long a penalty the damage ended still had to run, per key (it may have been told to the cache). */
  private readonly endedPenaltyMs = new Map<string, number>();

  /**
   * Tokens appeared in `key` some other way: a reset elsewhere, damage written into it. `penaltyLeftMs`:
   * what a running penalty the damage removed still had to run (issue 22: a refusal during a penalty is
   * told tokens that last until its end, so the cache may deny until then).
   */
  gained(key: string, penaltyLeftMs = 0): void {
    this.unseen.set(key, this.clock);
    this.endedPenaltyMs.set(key, penaltyLeftMs);
  }

  /** One bucket used with another policy (by another caller): documented as outside what the cache sees. */
  used(requests: readonly ModelRequest[]): void {
    for (const r of requests) {
      const policy = `${r.capacity}/${r.refillPerSecond}/${r.blockSeconds ?? 0}`;
      const last = this.lastPolicy.get(r.key);
      if (last !== undefined && last !== policy) this.gained(r.key);
      this.lastPolicy.set(r.key, policy);
    }
  }

  /**
   * The README's bound on that damage: the cache may deny for one window (B/R + blockSeconds) after it.
   * (This test found that an entry learned under a penalty used to answer the same B and R without one,
   * whose call repairs the negative tokens to 0: a bucket left at -29 by a 30 s penalty at 1/s was denied
   * for ~30 s to a caller the store allowed after 1 s. The cache now tells policies apart by blockSeconds
   * too, so the window is the request's own.)
   */
  private isExcused(requests: readonly ModelRequest[]): boolean {
    return requests.some((r) => {
      const since = Math.max(this.unseen.get(r.key) ?? -Infinity, this.forwardStep);
      const block = r.blockSeconds ?? 0;
      const windowMs = (r.capacity / r.refillPerSecond + block) * 1000 + (this.endedPenaltyMs.get(r.key) ?? 0);
      return this.clock - since <= windowMs + 2;
    });
  }

  /** Before a take: what the cache would answer, checked against what the model says the store holds. */
  before(requests: BucketRequest[], truth: ModelOutcome, step: number): boolean {
    const denied = this.cache.deny(requests, this.clock);
    if (denied === undefined) return false;
    this.denials++;
    // While a penalty runs every take is refused: the denial is right, and the tokens a refusal is told
    // then depend on its cost (issue 22), so a bound learned from another cost may be below them.
    const wrong = truth.allowed || denied.some((most, i) => !truth.running[i] && most < truth.tokens[i] && !close(most, truth.tokens[i]));
    if (wrong) {
      if (!this.isExcused(requests))
        fail('the deny cache denies what the model allows (or bounds it below the model)', {
          step,
          requests,
          denied,
          truth,
          clock: this.clock,
        });
      this.excused++;
    }
    return true;
  }
}

// ---------------------------------------------------------------------------------------------------

describe('the token bucket against a reference model (fast-check)', () => {
  const prefix = testPrefix('model');
  let client: Redis;
  let store: RedisBucketStore;
  let run = 0;
  const totals = {
    ops: 0,
    denials: 0,
    excused: 0,
    restored: 0,
    allowed: 0,
    refused: 0,
    waited: 0,
    tooLong: 0,
    aborted: 0,
    floored: 0,
    flooredAllowed: 0,
    flooredRefused: 0,
  };

  beforeAll(async () => {
    client = new Redis(await redisUrl(), { enableOfflineQueue: false, lazyConnect: true });
    await client.connect();
    store = new RedisBucketStore(client, false);
  });

  afterAll(async () => {
    await deleteKeys(client, prefix);
    await client.quit();
  });

  async function runScenario(scenario: Scenario): Promise<void> {
    const keys = Array.from({ length: KEYS }, (_, k) => `${prefix}${run}:{k${k}}`);
    run++;
    const redis = new RedisLane(client, store);
    const shared = new SharedCallLane(client, store, `${prefix}${run - 1}:neighbour`, scenario.alternatives[0]);
    const lanes: Lane[] = [redis, new RenamedLane(shared, ':shared'), new MemoryLane()];
    const deny = new DenyCacheCheck();
    /**
     * Per key, the reservations still held, each with what its give-back names (the model's answer):
     * an abort gives back the last one (which still ends the queue, unless a take or damage came after
     * it) or, on odd steps, the first (a give-back from the middle of the queue).
     */
    const held: { cost: number; mark: ModelMark }[][] = keys.map(() => []);
    let now = T0;
    for (let step = 0; step < scenario.ops.length; step++) {
      const op = scenario.ops[step];
      switch (op.op) {
        case 'advance':
          now = Math.min(MAX_NOW, now + op.ms);
          deny.clock += op.ms;
          break;
        case 'step':
          now = Math.min(MAX_NOW, Math.max(T0 - 1e12, now + op.ms));
          if (op.ms > 0) deny.steppedForward();
          break;
        case 'reset':
          // BucketService.reset forgets its own deny-cache entry before and after the store's delete;
          // a reset on another instance cannot.
          if (!op.remote) deny.cache.forget(keys[op.k]);
          for (const lane of lanes) await lane.reset(keys[op.k]);
          held[op.k] = [];
          deny.tick();
          if (op.remote) deny.gained(keys[op.k]);
          else deny.cache.forget(keys[op.k]);
          break;
        case 'corrupt': {
          const policy = scenario.policies[op.k];
          if (op.tokens === undefined && op.ts === undefined && !redis.model.has(keys[op.k], now)) {
            break; // a hash with only `b` or `w` is not a bucket; damage goes into buckets
          }
          const fields = {
            tokens: op.tokens === undefined ? undefined : damage(op.tokens, now, policy),
            ts: op.ts === undefined ? undefined : damage(op.ts, now, policy),
            b: op.b === undefined ? undefined : damage(op.b, now, policy),
            w: op.w === undefined ? undefined : damage(op.w, now, policy),
            d: undefined,
          };
          const b = redis.model.has(keys[op.k], now) ? redis.model.entries.get(keys[op.k])?.b : undefined;
          for (const lane of lanes) await lane.corrupt(keys[op.k], fields, now, policy);
          deny.gained(keys[op.k], b !== undefined && Number.isFinite(b) && b > now ? b - now : 0);
          break;
        }
        case 'reserve':
        case 'abort': {
          // acquire(): a reservation of the key's own numbers (a BucketService policy has no penalty), and
          // an aborted wait giving back the last one still held.
          const policy = scenario.policies[op.k];
          const base = { key: keys[op.k], capacity: policy.capacity, refillPerSecond: policy.refillPerSecond };
          if (op.op === 'abort') {
            const reservation = step % 2 === 0 ? held[op.k].pop() : held[op.k].shift();
            if (reservation === undefined) break;
            const { cost, mark } = reservation;
            deny.cache.forget(base.key);
            for (const lane of lanes) await lane.call([{ ...base, cost }], 'refund', now, step, undefined, mark);
            deny.tick();
            deny.cache.forget(base.key);
            totals.aborted++;
            break;
          }
          const tokens = redis.model.decide([{ ...base, cost: 0 }], 'peek', now, true).tokens[0];
          const request = { ...base, cost: resolveCost(op.cost, policy, tokens) };
          const boundMs = reservationBound(op.boundMs, policy.refillPerSecond);
          const reserve = { maxWaitMs: reservationWait(op.maxWait, boundMs), boundMs };
          const answer = await redis.call([request], 'take', now, step, reserve);
          for (const lane of lanes) if (lane !== redis) await lane.call([request], 'take', now, step, reserve);
          deny.tick();
          if (answer.allowed) {
            // What the give-back names, as acquire() passes it: the tokens the script said it left, and its now.
            held[op.k].push({ cost: request.cost, mark: { tokens: answer.tokens[0], nowMs: now } });
            if ((answer.waitMs ?? 0) > 0) totals.waited++;
          } else totals.tooLong++;
          break;
        }
        default: {
          const requests: ModelRequest[] = op.buckets.map(({ k, cost, alt, floor }) => {
            const policy = alt < 0 ? scenario.policies[k] : scenario.alternatives[alt];
            const key = keys[k];
            const held = redis.model.decide([{ key, ...policy, cost: 0 }], 'peek', now, true).tokens[0];
            const request: ModelRequest = { key, ...policy, cost: resolveCost(cost, policy, held) };
            // Priorities (issue 36): a floor the take must leave, from a share of the capacity or at the edge.
            const kept = resolveFloor(floor, policy, held, request.cost);
            if (kept !== undefined) {
              request.floor = kept;
              totals.floored++;
            }
            return request;
          });
          deny.used(requests);
          let cached = false;
          if (op.op === 'take') cached = deny.before(requests, redis.model.decide(requests, 'take', now, true), step);
          if (op.op === 'refund') for (const r of requests) deny.cache.forget(r.key);
          const sentAt = deny.clock;
          const answer = await redis.call(requests, op.op, now, step);
          if (op.op === 'take') checkFloors(redis.name, step, answer, requests);
          for (const lane of lanes) if (lane !== redis) await lane.call(requests, op.op, now, step);
          deny.tick();
          if (op.op === 'refund') for (const r of requests) deny.cache.forget(r.key);
          if (op.op === 'take') {
            if (answer.allowed) totals.allowed++;
            else totals.refused++;
            if (requests.some((r) => (r.floor ?? 0) > 0)) totals[answer.allowed ? 'flooredAllowed' : 'flooredRefused']++;
            // BucketService learns the store's answers, and nothing from the requests its cache denied.
            if (!cached) deny.cache.learn(requests, answer, sentAt);
          }
        }
      }
      totals.ops++;
    }
    totals.denials += deny.denials;
    totals.excused += deny.excused;
    totals.restored += redis.restored + shared.restored;
  }

  it.each(SEEDS)(
    'agrees with the model over $runs random sequences (seed $seed)',
    async ({ seed, runs, drawn }) => {
      for (const key of Object.keys(totals) as (keyof typeof totals)[]) totals[key] = 0;
      try {
        await fc.assert(fc.asyncProperty(scenarioArb(true, true), runScenario), { seed, numRuns: runs, endOnFailure: false });
      } catch (error) {
        if (drawn) console.error(`model test: the drawn seed ${seed} failed; run it again with MODEL_SEED=${seed} MODEL_RUNS=${runs}`);
        throw error;
      }
      if (process.env.MODEL_VERBOSE) console.log(totals);
      // The draws of the fixed seeds reach what they are meant to reach (else the property says little). A
      // seed drawn for the run is there to find disagreements; its 100 sequences may fall short of these
      // shares by chance (seed 24512209: 23 waits for 25), which says nothing about the store.
      if (drawn) return;
      expect(totals.allowed).toBeGreaterThan(runs);
      expect(totals.refused).toBeGreaterThan(runs / 4);
      expect(totals.denials).toBeGreaterThan(0);
      // Reservations that waited, ones refused for a wait beyond their longest, and waits given back.
      expect(totals.waited).toBeGreaterThan(runs / 4);
      expect(totals.tooLong).toBeGreaterThan(runs / 10);
      expect(totals.aborted).toBeGreaterThan(runs / 10);
    },
    Math.max(30_000, RUNS * 500),
  );

  /**
   * Priorities (issue 36, item 2): the same sequences with floors on takes, peeks and refunds (a share of
   * the capacity, or at the edge where tokens - floor = cost): the script's take above a floor (decide.lua
   * mode 3, its general path), the memory store and the model agree, and no take is admitted below its floor.
   */
  it.each(SEEDS.map(({ seed, runs, drawn }) => ({ seed: seed + 36, runs: Math.ceil(runs / 2), drawn })))(
    'agrees with the model with priority floors over $runs random sequences (seed $seed)',
    async ({ seed, runs, drawn }) => {
      for (const key of Object.keys(totals) as (keyof typeof totals)[]) totals[key] = 0;
      try {
        await fc.assert(fc.asyncProperty(scenarioArb(true, true, true), runScenario), { seed, numRuns: runs, endOnFailure: false });
      } catch (error) {
        if (drawn) console.error(`model test: the drawn seed ${seed} failed (priorities); run it again with MODEL_SEED=${seed - 36}`);
        throw error;
      }
      if (process.env.MODEL_VERBOSE) console.log(totals);
      if (drawn) return;
      // Floors that admitted and floors that refused, both reached.
      expect(totals.flooredAllowed).toBeGreaterThan(runs / 2);
      expect(totals.flooredRefused).toBeGreaterThan(runs / 4);
    },
    Math.max(30_000, RUNS * 500),
  );
});
