import { spawnSync } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Redis } from 'ioredis';
import { RedisBucketStore } from 'nest-redis-rate-limit';
import type { BucketRequest } from '../../../libs/rate-limit/src/stores/token-bucket.js';
import { FUTURE_TOLERANCE_MS, MAX_CAPACITY, MAX_WINDOW_SECONDS, penaltyCostOf } from '../../../libs/rate-limit/src/stores/token-bucket.js';
import { LUA_SCRIPTS } from '../../../libs/rate-limit/src/stores/redis/lua/lua-scripts.js';
import {
  appendDecision,
  appendGiveBack,
  appendLease,
  appendReservations,
} from '../../../libs/rate-limit/src/stores/redis/lua/script-codec.js';
import { slotGiveBackArgs, slotTakeArgs, takeWithSlotArgs } from '../../../libs/rate-limit/src/stores/redis/lua/slot-codec.js';
import { RedisServer, testPrefix } from '../../support/redis.js';

/**
 * Issue 34: the Redis scripts are `.lua` files, one per operation (libs/rate-limit/src/stores/redis/lua),
 * assembled with their includes into one generated module. Their headers are the protocol's reference:
 * the `--@argv` lines are checked here against the encoders the store calls; the assembled scripts pass
 * luacheck with the Redis globals; the bounds in include/limits.lua are the TypeScript ones; and each
 * script is loaded by name (EVALSHA) and again after SCRIPT FLUSH.
 */

const ROOT = fileURLToPath(new URL('../../../', import.meta.url));
const LUA = join(ROOT, 'libs/rate-limit/src/stores/redis/lua');
const BUILD = join(ROOT, 'libs/rate-limit/scripts/lua-build.mjs');

function build(...args: string[]) {
  return spawnSync(process.execPath, [BUILD, ...args], { encoding: 'utf8', cwd: ROOT });
}

/** The `--@argv <unit>: <names>` lines of a script's header, by unit. */
function argvLines(script: string): Map<string, string[]> {
  const lines = new Map<string, string[]>();
  for (const match of readFileSync(join(LUA, `${script}.lua`), 'utf8').matchAll(/^--@argv ([^:]+): (.+)$/gm)) {
    lines.set(match[1], match[2].trim().split(/\s+/));
  }
  return lines;
}

/** The arguments a unit's names stand for, from `values` (a name without a value fails the test). */
function expected(names: readonly string[], values: Record<string, number>): number[] {
  return names.map((name) => {
    if (!(name in values)) throw new Error(`the header names '${name}', which the test's sample has no value for`);
    return values[name];
  });
}

describe('the Redis scripts as .lua files', () => {
  it('has one file per operation, and the generated module is what they make', () => {
    expect(
      readdirSync(LUA)
        .filter((file) => file.endsWith('.lua'))
        .sort(),
    ).toEqual(['decide.lua', 'give-back.lua', 'lease.lua', 'reserve.lua', 'slot-give-back.lua', 'slot-take.lua', 'take-with-slot.lua']);
    expect(LUA_SCRIPTS.map((script) => script.name)).toEqual([
      'decide',
      'reserve',
      'give-back',
      'lease',
      'slot-take',
      'slot-give-back',
      'take-with-slot',
    ]);
    const checked = build('--check');
    expect(checked.stderr).toBe('');
    expect(checked.status).toBe(0);
    for (const script of LUA_SCRIPTS) {
      expect(build('--print', script.name).stdout).toBe(script.lua);
      // Every include was replaced; the header stayed.
      expect(script.lua).not.toMatch(/--@include/);
      expect(script.lua).toMatch(/^-- [a-z-]+\.lua: /);
    }
  });

  it('passes luacheck with the Redis globals, and luacheck would see a mistake', () => {
    const linted = build('--lint');
    expect(linted.stderr).toBe('');
    expect(linted.status).toBe(0);
    // The same check on a script with an unused local and a global written by mistake.
    const planted = `local unused = 1\nmistake = 2\n${LUA_SCRIPTS[0].lua}`;
    const checked = spawnSync('luacheck', ['--config', join(ROOT, '.luacheckrc'), '--no-color', '--formatter', 'plain', '-'], {
      input: planted,
      encoding: 'utf8',
    });
    expect(checked.status).not.toBe(0);
    expect(checked.stdout).toMatch(/unused variable 'unused'/);
    expect(checked.stdout).toMatch(/setting non-standard global variable 'mistake'/);
  });

  it('bounds the numbers as the TypeScript arithmetic does (include/limits.lua)', () => {
    const limits = readFileSync(join(LUA, 'include/limits.lua'), 'utf8');
    const value = (name: string) => Number(new RegExp(`^local ${name} = (\\S+)$`, 'm').exec(limits)?.[1]);
    expect(value('MAX_CAPACITY')).toBe(MAX_CAPACITY);
    expect(value('MAX_WINDOW_SECONDS')).toBe(MAX_WINDOW_SECONDS);
    expect(value('FUTURE_TOLERANCE_MS')).toBe(FUTURE_TOLERANCE_MS);
  });

  describe('headers against the encoders', () => {
    const a: BucketRequest = { key: 'a', capacity: 101, refillPerSecond: 102, cost: 103 };
    const b: BucketRequest = { key: 'b', capacity: 201, refillPerSecond: 202, cost: 203 };

    it('decide.lua: a header per decision, then each bucket, with a penalty its two numbers more', () => {
      const header = argvLines('decide');
      expect([...header.keys()]).toEqual([
        'per decision',
        'per bucket',
        'per bucket with a penalty',
        'per bucket above a floor',
        'per bucket with a penalty above a floor',
        'last, optional',
      ]);
      expect(header.get('last, optional')).toEqual(['now']);

      const keys: string[] = [];
      const argv: (string | number)[] = [];
      appendDecision(keys, argv, [a, b], 'refund');
      expect(keys).toEqual(['a', 'b']);
      expect(argv).toEqual([
        ...expected(header.get('per decision')!, { header: 2 * 8 + 2 }),
        ...expected(header.get('per bucket')!, { capacity: 101, refillPerSecond: 102, cost: 103 }),
        ...expected(header.get('per bucket')!, { capacity: 201, refillPerSecond: 202, cost: 203 }),
      ]);

      const punished = { ...a, blockSeconds: 7 };
      const penalised: (string | number)[] = [];
      appendDecision([], penalised, [punished, b], 'take');
      expect(penalised).toEqual([
        ...expected(header.get('per decision')!, { header: 2 * 8 + 4 }),
        ...expected(header.get('per bucket with a penalty')!, {
          capacity: 101,
          refillPerSecond: 102,
          cost: 103,
          blockSeconds: 7,
          penaltyCost: penaltyCostOf(punished),
        }),
        ...expected(header.get('per bucket with a penalty')!, {
          capacity: 201,
          refillPerSecond: 202,
          cost: 203,
          blockSeconds: 0,
          penaltyCost: 203,
        }),
      ]);

      // A take above a floor (a priority's reserve, issue 36): mode 3, each bucket's keep last (0 without one);
      // a peek or a refund of the same buckets carries no floor.
      const floored = { ...a, floor: 20.2 };
      const above: (string | number)[] = [];
      appendDecision([], above, [floored, b], 'take');
      expect(above).toEqual([
        ...expected(header.get('per decision')!, { header: 2 * 8 + 3 }),
        ...expected(header.get('per bucket above a floor')!, { capacity: 101, refillPerSecond: 102, cost: 103, keep: 20.2 }),
        ...expected(header.get('per bucket above a floor')!, { capacity: 201, refillPerSecond: 202, cost: 203, keep: 0 }),
      ]);
      const both: (string | number)[] = [];
      appendDecision([], both, [{ ...punished, floor: 5 }], 'take');
      expect(both).toEqual([
        ...expected(header.get('per decision')!, { header: 8 + 4 + 3 }),
        ...expected(header.get('per bucket with a penalty above a floor')!, {
          capacity: 101,
          refillPerSecond: 102,
          cost: 103,
          blockSeconds: 7,
          penaltyCost: penaltyCostOf(punished),
          keep: 5,
        }),
      ]);
      const peeked: (string | number)[] = [];
      appendDecision([], peeked, [floored], 'peek');
      expect(peeked).toEqual([8 + 1, 101, 102, 103]);
    });

    it('reserve.lua: per batch its count and numbers, then a cost and a longest wait per reservation', () => {
      const header = argvLines('reserve');
      expect([...header.keys()]).toEqual(['per batch', 'per reservation', 'last, optional']);
      const keys: string[] = [];
      const argv: (string | number)[] = [];
      appendReservations(keys, argv, a, 5_000, [
        { cost: 3, maxWaitMs: 40 },
        { cost: 4, maxWaitMs: 50 },
      ]);
      expect(keys).toEqual(['a']);
      expect(argv).toEqual([
        ...expected(header.get('per batch')!, { count: 2, capacity: 101, refillPerSecond: 102, longestWaitMs: 5_000 }),
        ...expected(header.get('per reservation')!, { cost: 3, maxWaitMs: 40 }),
        ...expected(header.get('per reservation')!, { cost: 4, maxWaitMs: 50 }),
      ]);
    });

    it("lease.lua: the bucket's numbers, the holder, what it keeps, gives back and asks for, and the life", () => {
      const header = argvLines('lease');
      expect([...header.keys()]).toEqual(['per call', 'last, optional']);
      const keys: string[] = [];
      const argv: (string | number)[] = [];
      appendLease(keys, argv, a, { holder: 'instance-1', kept: 5, returned: 2, want: 30, lifeMs: 500 });
      expect(keys).toEqual(['a']);
      // The holder is text: the sample names it by a number the test maps back.
      expect(argv.map((value) => (value === 'instance-1' ? -1 : value))).toEqual(
        expected(header.get('per call')!, { capacity: 101, refillPerSecond: 102, holder: -1, kept: 5, returned: 2, want: 30, lifeMs: 500 }),
      );
    });

    it('slot-take.lua and slot-give-back.lua: the limit, the holder and the lease; the holder alone', () => {
      const take = argvLines('slot-take');
      expect([...take.keys()]).toEqual(['per call', 'last, optional']);
      expect(take.get('last, optional')).toEqual(['now']);
      // EVALSHA's numkeys and the key, then the arguments; the holder is text, named by a number the test maps back.
      const args = slotTakeArgs({ key: 'a', limit: 7, holder: 'h-1', leaseMs: 900 }, 1_800_000_000_000);
      expect(args.slice(0, 2)).toEqual([1, 'a']);
      expect(args.slice(2).map((value) => (value === 'h-1' ? -1 : value))).toEqual([
        ...expected(take.get('per call')!, { limit: 7, holder: -1, leaseMs: 900 }),
        ...expected(take.get('last, optional')!, { now: 1_800_000_000_000 }),
      ]);
      const giveBack = argvLines('slot-give-back');
      expect([...giveBack.keys()]).toEqual(['per call']);
      expect(slotGiveBackArgs('a', 'h-1').slice(2)).toEqual(giveBack.get('per call')!.map((name) => (name === 'holder' ? 'h-1' : name)));
    });

    it("take-with-slot.lua: a take's header and buckets as decide.lua's, then the slot's limit, holder and lease", () => {
      const header = argvLines('take-with-slot');
      const decide = argvLines('decide');
      expect([...header.keys()]).toEqual([
        'per call',
        'per bucket',
        'per bucket with a penalty',
        'per bucket above a floor',
        'per bucket with a penalty above a floor',
        'per slot',
        'last, optional',
      ]);
      for (const unit of [
        'per bucket',
        'per bucket with a penalty',
        'per bucket above a floor',
        'per bucket with a penalty above a floor',
      ]) {
        expect(header.get(unit)).toEqual(decide.get(unit));
      }
      const args = takeWithSlotArgs([{ ...a, floor: 4 }, b], { key: 's', limit: 7, holder: 'h-1', leaseMs: 900 }, 1_800_000_000_000);
      // numkeys, the buckets' keys, then the slot's key.
      expect(args.slice(0, 4)).toEqual([3, 'a', 'b', 's']);
      expect(args.slice(4).map((value) => (value === 'h-1' ? -1 : value))).toEqual([
        ...expected(header.get('per call')!, { header: 2 * 8 + 3 }),
        ...expected(header.get('per bucket above a floor')!, { capacity: 101, refillPerSecond: 102, cost: 103, keep: 4 }),
        ...expected(header.get('per bucket above a floor')!, { capacity: 201, refillPerSecond: 202, cost: 203, keep: 0 }),
        ...expected(header.get('per slot')!, { limit: 7, holder: -1, leaseMs: 900 }),
        ...expected(header.get('last, optional')!, { now: 1_800_000_000_000 }),
      ]);
    });

    it('give-back.lua: per give-back the numbers and the mark of the reservation', () => {
      const header = argvLines('give-back');
      expect([...header.keys()]).toEqual(['per give-back', 'last, optional']);
      const keys: string[] = [];
      const argv: (string | number)[] = [];
      appendGiveBack(keys, argv, a, { tokens: -2.5, nowMs: 1_800_000_000_123 });
      expect(keys).toEqual(['a']);
      expect(argv).toEqual(
        expected(header.get('per give-back')!, {
          capacity: 101,
          refillPerSecond: 102,
          cost: 103,
          markTokens: -2.5,
          markMs: 1_800_000_000_123,
        }),
      );
    });
  });

  describe('loaded by name', () => {
    const prefix = testPrefix('lua-scripts');
    let server: RedisServer;
    let client: Redis;
    let store: RedisBucketStore;

    beforeAll(async () => {
      // Its own server: SCRIPT FLUSH on the shared one would make other files' counts of EVAL wrong.
      server = await RedisServer.start();
      client = new Redis(server.url);
      store = new RedisBucketStore(client, false);
    });

    afterAll(async () => {
      client?.disconnect();
      await server?.stop();
    });

    /** A take, a reservation that waits, its give-back, and a lease: one call of each script. */
    async function eachScript(key: string) {
      const request: BucketRequest = { key: `${prefix}${key}`, capacity: 2, refillPerSecond: 1, cost: 2 };
      const took = await store.take([request]);
      const reserved = await store.take([request], { reserve: { maxWaitMs: 5_000, boundMs: 5_000 } });
      const gaveBack = await store.take([request], { refund: true, givesBack: { tokens: reserved.tokens[0], nowMs: reserved.nowMs! } });
      const leased = await store.lease(
        { ...request, key: `${prefix}${key}-leased` },
        { holder: 'h', kept: 0, returned: 0, want: 1, lifeMs: 100 },
      );
      const slot = { key: `${prefix}${key}-slots`, limit: 1, holder: 'h', leaseMs: 1_000 };
      const slotTaken = await store.takeSlot(slot);
      const slotGiven = await store.giveBackSlot(slot.key, slot.holder);
      const together = await store.takeWithSlot([{ ...request, key: `${prefix}${key}-together` }], slot);
      return { took, reserved, gaveBack, leased, slotTaken, slotGiven, together };
    }

    it('runs each script by its SHA, and loads each again after SCRIPT FLUSH', async () => {
      const first = await eachScript('first');
      expect(first.took).toEqual({ allowed: true, tokens: [0] });
      expect(first.reserved.allowed).toBe(true);
      expect(first.reserved.waitMs).toBeGreaterThan(1_500);
      expect(first.reserved.tokens[0]).toBeLessThan(-1);
      // The give-back returns the last reservation: the bucket is back near 0 (what it refilled meanwhile).
      expect(first.gaveBack.allowed).toBe(true);
      expect(first.gaveBack.tokens[0]).toBeGreaterThanOrEqual(0);
      expect(first.gaveBack.tokens[0]).toBeLessThan(0.5);
      expect(first.leased).toEqual({ granted: 1, kept: 0, tokens: 1, penaltyMs: 0 });
      expect(first.slotTaken).toEqual({ held: true, inFlight: 1, waitMs: 0 });
      expect(first.slotGiven).toEqual({ released: true, inFlight: 0 });
      expect(first.together).toEqual({ allowed: true, tokens: [0], slot: { held: true, inFlight: 1, waitMs: 0 } });
      expect(await client.script('EXISTS', ...LUA_SCRIPTS.map((script) => script.sha))).toEqual(LUA_SCRIPTS.map(() => 1));

      await client.script('FLUSH');
      expect(await client.script('EXISTS', ...LUA_SCRIPTS.map((script) => script.sha))).toEqual(LUA_SCRIPTS.map(() => 0));
      const again = await eachScript('again');
      expect(again.took).toEqual(first.took);
      expect(again.reserved.allowed).toBe(true);
      expect(again.gaveBack.tokens[0]).toBeLessThan(0.5);
      expect(again.leased).toEqual(first.leased);
      expect(again.slotTaken).toEqual(first.slotTaken);
      expect(again.slotGiven).toEqual(first.slotGiven);
      expect(again.together).toEqual(first.together);
      expect(await client.script('EXISTS', ...LUA_SCRIPTS.map((script) => script.sha))).toEqual(LUA_SCRIPTS.map(() => 1));
    });
  });
});
