import { execFile, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdirSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { setTimeout as sleep } from 'node:timers/promises';
import { promisify } from 'node:util';
import type { ChildProcess } from 'node:child_process';
import { NestFactory } from '@nestjs/core';
import autocannon from 'autocannon';
import { Redis } from 'ioredis';
import { type BucketRequest, BucketService, RateLimitModule, RedisBucketStore } from 'nest-redis-rate-limit';
import { CONCURRENCY_VARIANTS, type ConcurrencyVariant } from './concurrency-app.js';
import { FloorSlots } from './concurrency-floor.js';
import type { BenchModuleOptions } from './limiters.js';
import { fmt, HERE, progress, rotate, stopChild, track } from './processes.js';
import { type CommandStats, commandStats, freePort, redisCpuSeconds } from './redis.js';
import { CONCURRENCY, LIMITS, SETTINGS } from './settings.js';
import { quantile, round, type Spread, spreadOf } from './stats.js';

const run = promisify(execFile);

/**
 * The concurrency step (issue 36, item 4): what `@ConcurrencyLimit` costs Redis beside `@RateLimit`.
 *
 * 1. HTTP. One app process per variant (concurrency-app.ts: GET /work with no limiter, ours `@RateLimit` with
 *    default options and with `coalesce: false`, ours `@ConcurrencyLimit(CONCURRENCY.limit)`, ours `@RateLimit`
 *    with `phase: 'after-guards'` + `@ConcurrencyLimit` (rate-slot: both in one take-with-slot.lua call, then a
 *    give-back), the same policy decided in the guard + `@ConcurrencyLimit` (rate-slot-apart: the coalesced rate
 *    call, slot-take.lua, slot-give-back.lua), and the floor: a sorted set, ZREMRANGEBYSCORE + ZCARD + ZADD +
 *    PEXPIRE in one script to take, ZREM to give back),
 *    all on the run's Redis; per round (rotated order): Redis' idle CPU rate for 0.4 s, `warmupSeconds` of
 *    load, then `seconds` measured, autocannon with SETTINGS.connections connections. Every request comes
 *    from 127.0.0.1: one key per variant, `limit` above the connections so nothing is refused.
 *    - Redis calls per request: the commands an app sends (EVALSHA, EVAL, and ZREM, which no script here
 *      calls) of INFO commandstats over the measured part, divided by the answers.
 *    - Redis command µs per request: those commands' usec (a script's includes the commands it calls):
 *      the time spent executing them, steady from round to round, without reading and writing the calls.
 *    - Redis CPU µs per request: INFO cpu (main thread user + sys) less the idle rate: everything the
 *      server did, including the socket reads, parsing and replies of each call. Two calls per request
 *      against a share of one coalesced call show here, not in the command time.
 * 2. Callgrind (BENCH_CONCURRENCY_CALLGRIND=1, the default): a redis-server of its own under
 *    `valgrind --tool=callgrind --instr-atstart=no`, and one client in this process doing one operation at a
 *    time: ours through BucketService (`coalesce: false`: one decide.lua call per `consume`; `takeSlot` and
 *    `release`), the store directly for a rate take and a slot in one call (`RedisBucketStore.takeWithSlot`, one
 *    take-with-slot.lua call, then `giveBackSlot`: BucketService has no API for it, it is route-level), the floor
 *    through its script and ZREM. After `warmup` of each, instrumentation on; per
 *    operation `segments` segments of `n` operations, each zeroed and dumped; instructions per operation =
 *    the segment's total / n (the median segment), less the server's idle instructions over as long
 *    (measured in a segment with no calls). "Lone": the key holds no other slot (a take creates it, the
 *    give-back deletes it); "busy": `others` slots held by other holders the whole time, as under the HTTP load.
 * Nothing is asserted.
 */

interface App {
  child: ChildProcess;
  url: string;
}

export interface ConcurrencyRun {
  round: number;
  variant: ConcurrencyVariant;
  requestsPerSecond: number;
  answers: number;
  status2xx: number;
  other: number;
  p50Ms: number;
  p99Ms: number;
  /** EVALSHA + EVAL + ZREM calls (INFO commandstats) over the measured part, per answer. */
  redisCallsPerRequest: number;
  /** The calls by command. */
  calls: Record<string, number>;
  /** Those commands' usec (commandstats) per answer. */
  commandUsPerRequest: number;
  /** INFO cpu (main thread) less the idle rate, per answer. */
  cpuUsPerRequest: number;
}

export interface CallgrindOperation {
  name: string;
  /** Redis calls per operation. */
  calls: number;
  /** Instructions per operation, per segment (idle instructions subtracted). */
  segments: number[];
  perOperation: number;
  /** The median segment's total / n, idle instructions included. */
  rawPerOperation: number;
  seconds: number[];
}

export interface ConcurrencyResult {
  settings: typeof CONCURRENCY & { connections: number };
  method: string;
  runs: ConcurrencyRun[];
  /** Per variant, median (min–max) over rounds. */
  summary: Record<
    ConcurrencyVariant,
    { requestsPerSecond: Spread; ratioToNone: Spread; callsPerRequest: Spread; commandUsPerRequest: Spread; cpuUsPerRequest: Spread }
  >;
  /**
   * Ratios per round, median (min–max): the slots' Redis cost per request against the rate paths' and the
   * floor's; rate-slot's against rate-slot-apart's and the rate paths'.
   */
  ratios: Record<string, Spread>;
  callgrind?: { valgrind: string; idlePerSecond: number; operations: CallgrindOperation[]; ratios: Record<string, number> };
}

const CLIENT_COMMANDS = ['evalsha', 'eval', 'zrem'];

export const concurrencyPlannedSeconds = () =>
  CONCURRENCY_VARIANTS.length * (8 + CONCURRENCY.rounds * (CONCURRENCY.warmupSeconds + CONCURRENCY.seconds + 0.8)) +
  (CONCURRENCY.callgrind ? 40 + (CONCURRENCY.warmup * 7 + CONCURRENCY.n * CONCURRENCY.segments * 7) * 0.004 : 0);

async function startApp(variant: ConcurrencyVariant, prefix: string): Promise<App> {
  const child = track(
    spawn(process.execPath, [join(HERE, 'concurrency-app.js'), variant, prefix], { stdio: ['ignore', 'pipe', 'inherit'] }),
  );
  const lines = createInterface({ input: child.stdout! });
  const port = await new Promise<number>((done, fail) => {
    const timer = setTimeout(() => fail(new Error(`concurrency app (${variant}) did not start within 20 s`)), 20_000);
    child.once('exit', (code) => fail(new Error(`concurrency app (${variant}) exited with ${code} before listening`)));
    lines.once('line', (line) => {
      clearTimeout(timer);
      done((JSON.parse(line) as { port: number }).port);
    });
  });
  return { child, url: `http://127.0.0.1:${port}` };
}

function clientCalls(before: CommandStats, after: CommandStats): { calls: Record<string, number>; total: number; usec: number } {
  const calls: Record<string, number> = {};
  let total = 0;
  let usec = 0;
  for (const name of CLIENT_COMMANDS) {
    const a = after.get(name);
    if (!a) continue;
    const b = before.get(name) ?? { calls: 0, usec: 0 };
    if (a.calls === b.calls) continue;
    calls[name] = a.calls - b.calls;
    total += a.calls - b.calls;
    usec += a.usec - b.usec;
  }
  return { calls, total, usec };
}

async function load(url: string, seconds: number) {
  const latencies: number[] = [];
  const instance = autocannon({ url: `${url}/work`, connections: SETTINGS.connections, duration: seconds });
  instance.on('response', (_client, _status, _bytes, ms) => void latencies.push(ms));
  return { result: await instance, latencies };
}

async function httpPhase(redis: Redis, runPrefix: string): Promise<ConcurrencyRun[]> {
  const t0 = Date.now();
  const apps = {} as Record<ConcurrencyVariant, App>;
  for (const variant of CONCURRENCY_VARIANTS) apps[variant] = await startApp(variant, `${runPrefix}cc-${variant}:`);
  progress('concurrency', `started ${CONCURRENCY_VARIANTS.length} apps (${CONCURRENCY_VARIANTS.join(', ')})`, Date.now() - t0);
  const runs: ConcurrencyRun[] = [];
  try {
    for (let r = 0; r < CONCURRENCY.rounds; r++) {
      for (const variant of rotate(CONCURRENCY_VARIANTS, r)) {
        const t = Date.now();
        const app = apps[variant];
        const idle0 = await redisCpuSeconds(redis);
        const idleT0 = performance.now();
        await sleep(400);
        const idleRate = ((await redisCpuSeconds(redis)) - idle0) / ((performance.now() - idleT0) / 1000);
        if (CONCURRENCY.warmupSeconds > 0) await load(app.url, CONCURRENCY.warmupSeconds);
        const stats0 = await commandStats(redis);
        const cpu0 = await redisCpuSeconds(redis);
        const w0 = performance.now();
        const { result, latencies } = await load(app.url, CONCURRENCY.seconds);
        const cpu1 = await redisCpuSeconds(redis);
        const wall = (performance.now() - w0) / 1000;
        const stats1 = await commandStats(redis);
        const answers = result['2xx'] + result.non2xx;
        const client = clientCalls(stats0, stats1);
        const run: ConcurrencyRun = {
          round: r + 1,
          variant,
          requestsPerSecond: result.requests.average,
          answers,
          status2xx: result['2xx'],
          other: result.non2xx + result.errors + result.timeouts,
          p50Ms: round(quantile(latencies, 0.5), 2),
          p99Ms: round(quantile(latencies, 0.99), 2),
          redisCallsPerRequest: round(client.total / answers, 4),
          calls: client.calls,
          commandUsPerRequest: round(client.usec / answers, 3),
          cpuUsPerRequest: round(((cpu1 - cpu0 - Math.max(0, idleRate) * wall) * 1e6) / answers, 3),
        };
        runs.push(run);
        progress(
          'concurrency',
          `round ${r + 1} ${variant}: ${fmt(run.requestsPerSecond)} req/s, ${fmt(run.status2xx)} 2xx${run.other ? `, ${fmt(run.other)} other` : ''}; ` +
            `${run.redisCallsPerRequest} Redis calls, ${run.commandUsPerRequest} command µs, ${run.cpuUsPerRequest} CPU µs per request`,
          Date.now() - t,
        );
      }
    }
  } finally {
    await Promise.all(Object.values(apps).map((app) => stopChild(app.child)));
  }
  return runs;
}

/** Callgrind of redis-server: instructions per operation. */
async function callgrindPhase(workDir: string): Promise<NonNullable<ConcurrencyResult['callgrind']>> {
  const t0 = Date.now();
  const { warmup, n, segments, others } = CONCURRENCY;
  rmSync(workDir, { recursive: true, force: true });
  mkdirSync(workDir, { recursive: true });
  const outFile = join(workDir, 'callgrind.out');
  const port = await freePort();
  const args = ['--tool=callgrind', '--instr-atstart=no', `--callgrind-out-file=${outFile}`, `--log-file=${join(workDir, 'valgrind.log')}`];
  args.push('redis-server', '--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', workDir);
  const child = track(spawn('valgrind', args, { stdio: ['ignore', 'ignore', 'inherit'] }));
  const url = `redis://127.0.0.1:${port}`;
  const valgrind = (await run('valgrind', ['--version'])).stdout.trim();
  const pid = child.pid!;
  const control = async (...flags: string[]) => {
    const { stdout } = await run('callgrind_control', [...flags, String(pid)], { timeout: 120_000 });
    if (!stdout.includes('OK')) throw new Error(`callgrind_control ${flags.join(' ')} ${pid}: ${stdout.trim()}`);
  };
  let dumps = 0;
  const total = () => {
    const text = readFileSync(`${outFile}.${++dumps}`, 'utf8');
    const match = /^totals:\s+(\d+)/m.exec(text) ?? /^summary:\s+(\d+)/m.exec(text);
    if (!match) throw new Error(`no totals in ${outFile}.${dumps}`);
    return Number(match[1]);
  };
  const probe = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null });
  probe.on('error', () => undefined);
  for (let deadline = Date.now() + 120_000; ;) {
    try {
      await probe.connect();
      await probe.ping();
      break;
    } catch {
      probe.disconnect();
      if (Date.now() > deadline || child.exitCode !== null) throw new Error('redis-server under valgrind did not answer within 120 s');
      await sleep(500);
    }
  }
  probe.disconnect();
  const options: BenchModuleOptions = { redis: url, keyPrefix: 'cg:', coalesce: false, timeoutMs: 60_000 };
  const context = await NestFactory.createApplicationContext(RateLimitModule.forRoot(options), { logger: ['error', 'warn'] });
  const floorClient = new Redis(url);
  const floor = new FloorSlots(floorClient);
  // The route-level path (a rate take and a slot in one call) has no BucketService API: the store directly,
  // without coalescing, on a client of its own that queues nothing while disconnected (as the module's).
  const storeClient = new Redis(url, { lazyConnect: true, enableOfflineQueue: false });
  try {
    await storeClient.connect();
    const store = new RedisBucketStore(storeClient, false, false);
    const instance = randomBytes(6).toString('base64url');
    let next = 0;
    const holderId = () => `${instance}.${(next++).toString(36)}`;
    const withSlot = async (name: string) => {
      const request: BucketRequest = { key: `cg:{${name}}`, cost: 1, ...LIMITS.allowed };
      const slot = { key: `cg:{${name}}!`, limit: CONCURRENCY.limit, holder: holderId(), leaseMs: 30_000 };
      const taken = await store.takeWithSlot([request], slot);
      if (!taken.allowed || !taken.slot?.held) throw new Error('take with slot refused');
      if (!(await store.giveBackSlot(slot.key, slot.holder)).released) throw new Error('slot not given back');
    };
    const buckets = context.get(BucketService);
    await floor.load();
    const policy = { capacity: LIMITS.allowed.capacity, refillPerSecond: LIMITS.allowed.refillPerSecond };
    const limit = CONCURRENCY.limit;
    let holder = 0;
    const ops: Record<string, { calls: number; once: () => Promise<void> }> = {
      'rate decision (decide.lua, one decision per call)': {
        calls: 1,
        once: async () => void (await buckets.consume('rate', policy)),
      },
      'slots, lone: take + give back': {
        calls: 2,
        once: async () => {
          const slot = await buckets.takeSlot('lone', { limit });
          if (!slot.held) throw new Error('slot refused');
          await slot.release();
        },
      },
      'slots, busy: take + give back': {
        calls: 2,
        once: async () => {
          const slot = await buckets.takeSlot('busy', { limit });
          if (!slot.held) throw new Error('slot refused');
          await slot.release();
        },
      },
      'rate + slot in one call, lone: take-with-slot + give back': {
        calls: 2,
        once: () => withSlot('rs-lone'),
      },
      'rate + slot in one call, busy: take-with-slot + give back': {
        calls: 2,
        once: () => withSlot('rs-busy'),
      },
      'floor, lone: take + give back': {
        calls: 2,
        once: async () => {
          const id = `h${holder++}`;
          if ((await floor.take('{floor-lone}', limit, id, 30_000)) < 0) throw new Error('floor refused');
          await floor.giveBack('{floor-lone}', id);
        },
      },
      'floor, busy: take + give back': {
        calls: 2,
        once: async () => {
          const id = `h${holder++}`;
          if ((await floor.take('{floor-busy}', limit, id, 30_000)) < 0) throw new Error('floor refused');
          await floor.giveBack('{floor-busy}', id);
        },
      },
    };
    // The busy keys' other holders: held for the whole phase (leases of 30 s are renewed by their timers).
    const held = [];
    const heldInStore: string[] = [];
    for (let i = 0; i < others; i++) {
      held.push(await buckets.takeSlot('busy', { limit, leaseMs: 3_600_000 }));
      const other = holderId();
      await store.takeSlot({ key: 'cg:{rs-busy}!', limit, holder: other, leaseMs: 3_600_000 });
      heldInStore.push(other);
      await floor.take('{floor-busy}', limit, `other-${i}`, 3_600_000);
    }
    for (let i = 0; i < warmup; i++) for (const op of Object.values(ops)) await op.once();
    await control('-i', 'on');
    // The server's own instructions with no calls (serverCron): per second.
    await control('-z');
    const idleStart = performance.now();
    await sleep(2_000);
    await control('-d');
    const idlePerSecond = total() / ((performance.now() - idleStart) / 1000);
    const operations: CallgrindOperation[] = [];
    for (const [name, op] of Object.entries(ops)) {
      const perSegment: number[] = [];
      const raw: number[] = [];
      const seconds: number[] = [];
      for (let s = 0; s < segments; s++) {
        await control('-z');
        const start = performance.now();
        for (let i = 0; i < n; i++) await op.once();
        const took = (performance.now() - start) / 1000;
        await control('-d');
        const instructions = total();
        raw.push(round(instructions / n));
        perSegment.push(round((instructions - idlePerSecond * took) / n));
        seconds.push(round(took, 2));
      }
      const middle = (values: number[]) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)];
      operations.push({
        name,
        calls: op.calls,
        segments: perSegment,
        perOperation: middle(perSegment),
        rawPerOperation: middle(raw),
        seconds,
      });
      progress(
        'concurrency',
        `callgrind: ${name}: ${fmt(middle(perSegment))} instructions (segments ${perSegment.map(fmt).join(', ')})`,
        0,
      );
    }
    for (const slot of held) await slot.release();
    for (const other of heldInStore) await store.giveBackSlot('cg:{rs-busy}!', other);
    const of = (prefix: string) => operations.find((o) => o.name.startsWith(prefix))!.perOperation;
    const rate = of('rate decision');
    const ratios = {
      'slots lone ÷ rate decision': round(of('slots, lone') / rate, 3),
      'slots busy ÷ rate decision': round(of('slots, busy') / rate, 3),
      'slots lone ÷ floor lone': round(of('slots, lone') / of('floor, lone'), 3),
      'slots busy ÷ floor busy': round(of('slots, busy') / of('floor, busy'), 3),
      'floor busy ÷ rate decision': round(of('floor, busy') / rate, 3),
      'rate + slot in one call, lone ÷ (rate decision + slots lone)': round(
        of('rate + slot in one call, lone') / (rate + of('slots, lone')),
        3,
      ),
      'rate + slot in one call, busy ÷ (rate decision + slots busy)': round(
        of('rate + slot in one call, busy') / (rate + of('slots, busy')),
        3,
      ),
      'rate + slot in one call, lone ÷ rate decision': round(of('rate + slot in one call, lone') / rate, 3),
      'rate + slot in one call, busy ÷ rate decision': round(of('rate + slot in one call, busy') / rate, 3),
      '(rate + slot in one call, lone − rate decision) ÷ rate decision': round((of('rate + slot in one call, lone') - rate) / rate, 3),
      '(rate + slot in one call, busy − rate decision) ÷ rate decision': round((of('rate + slot in one call, busy') - rate) / rate, 3),
    };
    progress('concurrency', `callgrind done (idle ${fmt(idlePerSecond)} instructions/s)`, Date.now() - t0);
    return { valgrind, idlePerSecond: round(idlePerSecond), operations, ratios };
  } finally {
    await context.close();
    floorClient.disconnect();
    storeClient.disconnect();
    await stopChild(child, 'SIGKILL');
    if (process.env.BENCH_CONCURRENCY_KEEP !== '1') rmSync(workDir, { recursive: true, force: true });
  }
}

export async function concurrencyStep(redis: Redis, runPrefix: string, root: string): Promise<ConcurrencyResult> {
  const runs = await httpPhase(redis, runPrefix);
  const summary = {} as ConcurrencyResult['summary'];
  const rounds = Array.from({ length: CONCURRENCY.rounds }, (_, r) => r + 1);
  const at = (variant: ConcurrencyVariant, r: number) => runs.find((x) => x.variant === variant && x.round === r)!;
  for (const variant of CONCURRENCY_VARIANTS) {
    const mine = runs.filter((x) => x.variant === variant);
    summary[variant] = {
      requestsPerSecond: spreadOf(
        mine.map((x) => x.requestsPerSecond),
        0,
      ),
      ratioToNone: spreadOf(rounds.map((r) => at(variant, r).requestsPerSecond / at('none', r).requestsPerSecond)),
      callsPerRequest: spreadOf(
        mine.map((x) => x.redisCallsPerRequest),
        4,
      ),
      commandUsPerRequest: spreadOf(
        mine.map((x) => x.commandUsPerRequest),
        2,
      ),
      cpuUsPerRequest: spreadOf(
        mine.map((x) => x.cpuUsPerRequest),
        2,
      ),
    };
  }
  const ratios: Record<string, Spread> = {};
  for (const other of ['rate', 'rate-no-coalesce', 'floor'] as const) {
    ratios[`slots ÷ ${other}, command µs per request`] = spreadOf(
      rounds.map((r) => at('slots', r).commandUsPerRequest / at(other, r).commandUsPerRequest),
    );
    ratios[`slots ÷ ${other}, Redis CPU µs per request`] = spreadOf(
      rounds.map((r) => at('slots', r).cpuUsPerRequest / at(other, r).cpuUsPerRequest),
    );
  }
  const perRound = (name: string, value: (r: number) => number) => {
    ratios[name] = spreadOf(rounds.map(value));
  };
  const cost = { 'command µs per request': 'commandUsPerRequest', 'Redis CPU µs per request': 'cpuUsPerRequest' } as const;
  perRound(
    'rate-slot ÷ rate-slot-apart, Redis calls per request',
    (r) => at('rate-slot', r).redisCallsPerRequest / at('rate-slot-apart', r).redisCallsPerRequest,
  );
  for (const [label, field] of Object.entries(cost)) {
    perRound(`rate-slot ÷ rate-slot-apart, ${label}`, (r) => at('rate-slot', r)[field] / at('rate-slot-apart', r)[field]);
  }
  for (const other of ['rate-no-coalesce', 'rate'] as const) {
    for (const [label, field] of Object.entries(cost)) {
      perRound(`rate-slot ÷ ${other}, ${label}`, (r) => at('rate-slot', r)[field] / at(other, r)[field]);
      perRound(`rate-slot-apart ÷ ${other}, ${label}`, (r) => at('rate-slot-apart', r)[field] / at(other, r)[field]);
    }
  }
  // The slot's share of the one-call path: what rate-slot costs beyond one rate decision per call, in rate decisions.
  for (const [label, field] of Object.entries(cost)) {
    perRound(
      `(rate-slot − rate-no-coalesce) ÷ rate-no-coalesce, ${label}`,
      (r) => (at('rate-slot', r)[field] - at('rate-no-coalesce', r)[field]) / at('rate-no-coalesce', r)[field],
    );
  }
  const callgrind = CONCURRENCY.callgrind ? await callgrindPhase(join(root, '.bench-tmp', 'concurrency-callgrind')) : undefined;
  return { settings: { ...CONCURRENCY, connections: SETTINGS.connections }, method: method(), runs, summary, ratios, callgrind };
}

function method(): string {
  return (
    `HTTP: one Nest 12 Express app process per variant (bench/concurrency-app.ts), GET /work keyed by IP, every request from 127.0.0.1 ` +
    `(one key per variant): no limiter; ours @RateLimit(1e9, 1e9) with default options (coalescing on) and with coalesce: false; ours ` +
    `@ConcurrencyLimit(${CONCURRENCY.limit}) with default options (lease 30 s); rate-slot: @RateLimit({ capacity: 1e9, ` +
    `refillPerSecond: 1e9, phase: 'after-guards' }) + @ConcurrencyLimit(${CONCURRENCY.limit}) (one take-with-slot.lua call, one ` +
    `slot-give-back.lua call); rate-slot-apart: the same policy without a phase (decided in the guard, coalesced) + ` +
    `@ConcurrencyLimit(${CONCURRENCY.limit}) (decide.lua, slot-take.lua, slot-give-back.lua); the floor (bench/concurrency-floor.ts: a sorted set, ` +
    `ZREMRANGEBYSCORE + ZCARD + ZADD + PEXPIRE in one script to take, ZREM to give back when the response closes). ` +
    `autocannon in the bench process, ${SETTINGS.connections} connections, ${CONCURRENCY.warmupSeconds} s warm-up then ${CONCURRENCY.seconds} s ` +
    `measured per variant and round, ${CONCURRENCY.rounds} rounds in rotated order, on the run's Redis; ratios taken inside a round. ` +
    `Redis calls per request: EVALSHA + EVAL + ZREM calls of INFO commandstats over the measured part / answers. Command µs per request: ` +
    `their commandstats usec (a script's includes the commands it calls). Redis CPU µs per request: INFO cpu (main thread user + sys) ` +
    `less the idle rate measured for 0.4 s before the round, / answers.` +
    (CONCURRENCY.callgrind
      ? ` Callgrind: a redis-server of its own under valgrind --tool=callgrind --instr-atstart=no; one client in the bench process, one ` +
        `operation at a time (ours through BucketService with coalesce: false: consume() is one decide.lua call, takeSlot() + release() ` +
        `one slot-take.lua and one slot-give-back.lua call; RedisBucketStore(client, false, false).takeWithSlot() of one ` +
        `request + giveBackSlot(), one take-with-slot.lua and one slot-give-back.lua call; the floor's script + ZREM); ${CONCURRENCY.warmup} warm-up operations of each, ` +
        `then ${CONCURRENCY.segments} segments of ${CONCURRENCY.n} per operation, each zeroed and dumped: the median segment's total / n, ` +
        `less the server's idle instructions over as long. Busy: ${CONCURRENCY.others} other slots held in the key.`
      : '')
  );
}

const cell = (s: Spread, digits = 2) => `${s.median.toFixed(digits)} (${s.min.toFixed(digits)}–${s.max.toFixed(digits)})`;

const LABELS: Record<ConcurrencyVariant, string> = {
  none: 'no limiter',
  rate: '`@RateLimit` (coalescing, default)',
  'rate-no-coalesce': '`@RateLimit`, `coalesce: false`',
  slots: '**`@ConcurrencyLimit`**',
  'rate-slot': '**`@RateLimit` after the guards + `@ConcurrencyLimit`** (one call)',
  'rate-slot-apart': '`@RateLimit` in the guard + `@ConcurrencyLimit`',
  floor: 'floor: sorted set',
};

export function renderConcurrency(result: ConcurrencyResult, heading: string): string {
  const lines = [`${heading} Concurrency slots beside the rate path`, '', result.method, ''];
  lines.push('| variant | req/s | req/s ÷ no limiter | Redis calls per request | command µs per request | Redis CPU µs per request |');
  lines.push('|---|---:|---:|---:|---:|---:|');
  for (const variant of CONCURRENCY_VARIANTS) {
    const s = result.summary[variant];
    lines.push(
      `| ${LABELS[variant]} | ${fmt(s.requestsPerSecond.median)} (${fmt(s.requestsPerSecond.min)}–${fmt(s.requestsPerSecond.max)}) | ${cell(s.ratioToNone, 3)} | ` +
        `${cell(s.callsPerRequest, 3)} | ${cell(s.commandUsPerRequest)} | ${cell(s.cpuUsPerRequest)} |`,
    );
  }
  lines.push('', 'Median (min–max) over rounds; ratios per round:', '', '| ratio | median (min–max) |', '|---|---:|');
  for (const [name, s] of Object.entries(result.ratios)) lines.push(`| ${name} | ${cell(s, 3)} |`);
  lines.push(
    '',
    '| round | variant | req/s | answers | other | p50 / p99 ms | calls by command | calls / command µs / CPU µs per request |',
  );
  lines.push('|---|---|---:|---:|---:|---:|---|---:|');
  for (const x of result.runs) {
    lines.push(
      `| ${x.round} | ${x.variant} | ${fmt(x.requestsPerSecond)} | ${fmt(x.answers)} | ${x.other} | ${x.p50Ms} / ${x.p99Ms} | ` +
        `${Object.entries(x.calls)
          .map(([c, k]) => `${c} ${fmt(k)}`)
          .join(', ')} | ${x.redisCallsPerRequest} / ${x.commandUsPerRequest} / ${x.cpuUsPerRequest} |`,
    );
  }
  const cg = result.callgrind;
  if (cg) {
    lines.push(
      '',
      `Redis instructions per operation (callgrind, ${cg.valgrind}; idle ${fmt(cg.idlePerSecond)} instructions/s subtracted):`,
      '',
    );
    lines.push(
      '| operation | Redis calls | instructions per operation (median segment) | segments | idle included | seconds per segment |',
      '|---|---:|---:|---|---:|---|',
    );
    for (const op of cg.operations)
      lines.push(
        `| ${op.name} | ${op.calls} | ${fmt(op.perOperation)} | ${op.segments.map(fmt).join(', ')} | ${fmt(op.rawPerOperation)} | ${op.seconds.join(', ')} |`,
      );
    lines.push('', '| ratio | instructions |', '|---|---:|');
    for (const [name, ratio] of Object.entries(cg.ratios)) lines.push(`| ${name} | ${ratio.toFixed(3)} |`);
  }
  return `${lines.join('\n')}\n`;
}
