import { randomUUID } from 'node:crypto';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { cpus, loadavg, release, totalmem, type } from 'node:os';
import { basename, join, relative, resolve } from 'node:path';
import { Redis } from 'ioredis';
import { acquirePlannedSeconds, acquireStep, renderAcquire } from './acquire-step.js';
import { renderChart } from './chart.js';
import { concurrencyPlannedSeconds, concurrencyStep, renderConcurrency } from './concurrency-step.js';
import { decisionsPlannedSeconds, decisionsStep } from './decisions-step.js';
import { httpPlannedSeconds, httpStep } from './http-step.js';
import { instructionsPlannedSeconds, instructionsStep, renderInstructions } from './instructions-step.js';
import { LEASES_ALGORITHMS, leasesPlannedSeconds, leasesStep, renderLeases, renderLeasesChart } from './leases-step.js';
import { failureModePlannedSeconds, failureModeStep, renderFailureMode } from './failure-mode-step.js';
import { elapsed, HERE, liveChildren, planSeconds, progress, startedAt, stopChild } from './processes.js';
import { promisePlannedSeconds, promiseStep } from './promise-step.js';
import { deleteKeys, type OwnRedis, startOwnRedis } from './redis.js';
import { renderReport } from './report.js';
import type { BenchResults } from './results.js';
import { BASELINE, LIMITS, PROBE_LENGTH_MS, PROBE_OPEN_MS, SETTINGS } from './settings.js';
import { renderStarved, starvedPlannedSeconds, starvedStep } from './starved-step.js';
import { round } from './stats.js';
import { targets } from './targets.js';

/**
 * `npm run bench`: HTTP overhead, decisions per second and Redis cost, and the promise, for our
 * limiter, the peers and the floors, in one run. Writes bench/results/<date>.{json,svg,md}.
 *
 * Redis: a redis-server of the run's own on a free port (killed at the end, on Ctrl-C and on errors),
 * so that INFO cpu and INFO commandstats count only the bench; its URL reaches every child process in
 * BENCH_REDIS_URL. Set BENCH_REDIS_URL to use an existing server instead: keys then live under a prefix
 * of the run's own and are deleted at the end; nothing is ever flushed.
 *
 * BENCH_ONLY=http,decisions,promise runs a subset, BENCH_VARIANTS=ours,... only some HTTP variants and
 * decision limiters (with "none" and the reference script); BENCH_BASELINE=<commit> adds ours built from
 * that commit's library to the decisions step (`ours@<sha>`, see decisions-step.ts); such runs write
 * <date>-partial.* (BENCH_OUT=<name> names the files). Durations: see settings.ts.
 *
 * BENCH_ONLY=starved (or a list with it) adds the starved step: our app with default options beside 16
 * busy loops (see starved-step.ts). Not in the default run: for about two minutes it keeps the machine
 * fully busy, and it measures what CPU starvation does to the failure mode, not the overhead the other
 * steps compare. It writes <date>-starved.{json,md} (BENCH_OUT=<name>: <name>-starved.*); run alone, only those.
 * BENCH_ONLY=instructions: instructions per request of the app process under callgrind (see
 * instructions-step.ts); not in the default run (5-7 minutes on 2 shared cores). Run alone it writes <date>-instructions.{json,md}
 * (BENCH_OUT=<name>: <name>-instructions.*). BENCH_LIBRARY_DIR=<built package> measures another build
 * of the library (bench/compare-instructions.ts).
 * BENCH_ONLY=acquire: 4 processes waiting for grants from one bucket, ours (BucketService.acquire()) beside
 * rate-limiter-flexible's RateLimiterQueue (see acquire-step.ts); not in the default run. Run alone it writes
 * <date>-acquire.{json,md} (BENCH_OUT=<name>: <name>-acquire.*).
 * BENCH_ONLY=failure-mode: the default failureMode ('local') beside 'open', with a healthy Redis and with
 * none listening (see failure-mode-step.ts); not in the default run. Run alone it writes
 * <date>-failure-mode.{json,md} (BENCH_OUT=<name>: <name>-failure-mode.*).
 * BENCH_ONLY=leases: one hot key, 4 app processes per variant, ours leased (lease: true) beside ours exact, the
 * reference script and rate-limiter-flexible (see leases-step.ts); in the default run (about a minute). It writes
 * <date>-leases.{json,md,svg} (BENCH_OUT=<name>: <name>-leases.*); run alone, only those.
 * BENCH_ONLY=concurrency: @ConcurrencyLimit's Redis calls, command time and CPU per request beside @RateLimit, no limiter and
 * a sorted-set floor over HTTP, then Redis instructions per operation under callgrind (see concurrency-step.ts); not in the
 * default run. Run alone it writes <date>-concurrency.{json,md} (BENCH_OUT=<name>: <name>-concurrency.*).
 * BENCH_PROFILE=<variant> starts that HTTP variant with --cpu-prof (profiles in .bench-tmp/profiles).
 */

const ROOT = resolve(HERE, '../..');
const RESULTS_DIR = join(ROOT, 'bench', 'results');
const RUN_PREFIX = `rl-bench:${randomUUID().slice(0, 8)}:`;
const ONLY = new Set((process.env.BENCH_ONLY ?? 'http,decisions,promise,leases').split(',').map((s) => s.trim()));
/**
 * The steps of the default run whose figures go into <date>.*; 'leases' runs by default too but writes files of its own,
 * and 'instructions', 'starved', 'acquire', 'failure-mode' and 'concurrency' run only when BENCH_ONLY names them, and write files of their own.
 */
const MAIN_STEPS = ['http', 'decisions', 'promise'];
const UNKNOWN_STEP = [...ONLY].find(
  (step) => ![...MAIN_STEPS, 'leases', 'instructions', 'starved', 'acquire', 'failure-mode', 'concurrency'].includes(step),
);
if (UNKNOWN_STEP !== undefined)
  throw new Error(
    `BENCH_ONLY: unknown step "${UNKNOWN_STEP}" (steps: ${MAIN_STEPS.join(', ')}, leases, instructions, starved, acquire, failure-mode, concurrency)`,
  );
const EXTERNAL_REDIS = process.env.BENCH_REDIS_URL;

let ownRedis: OwnRedis | undefined;

const ALGORITHMS: BenchResults['algorithms'] = {
  ours:
    'token bucket, one Redis hash {tokens, ts} per bucket, one script per decision (decisions pending in the same event-loop turn ' +
    'are sent as one call unless coalesce: false); after a denial the instance denies locally until the next token can exist (deny cache, on by default)',
  'ours-no-coalesce': 'ours with coalesce: false: one script call per decision, one bucket per call',
  reference:
    'the reference token-bucket script written for the bench (bench/reference-script.ts): Redis TIME, HMGET tokens ts, refill, drain 1, ' +
    'HSET of Lua numbers, PEXPIRE ceil(2·capacity/refill·1000) ms, one integer reply; EVALSHA through a plain ioredis client: the floor',
  'minimal-guard':
    'an APP_GUARD doing one EVALSHA of the reference script (replying the tokens left, or minus the ms to the next token) and writing ' +
    'the headers ours writes by default (X-RateLimit-Limit/-Remaining/-Reset, RateLimit-Limit/-Remaining/-Reset/-Policy, Retry-After when refused): the allowed-path floor',
  'throw-only':
    'a guard on /denied that throws HttpException 429 (built without a stack trace, as ours builds its refusals) and touches no Redis: the denied-path floor',
  'throw-later':
    'the throw-only guard answering one event-loop turn later: it returns a promise rejected after setImmediate, as a refusal that waited for ' +
    'a Redis reply is answered in a later turn; not a floor, it shows what answering in a later turn is worth on the machine',
  'rate-limiter-flexible':
    'fixed window counter, one string key per key and window; one EVALSHA (SET NX EX, INCRBY, PTTL) per consume; default options (no in-memory block); ' +
    'over HTTP behind the short guard its users write (it ships none), with X-RateLimit-* headers',
  'nestjs-throttler':
    'fixed window counter plus a block key; ThrottlerGuard calls storage.increment(): one EVAL that sends the script body every call (INCR, PTTL, GET/SET block)',
};

function plan(): number {
  let seconds = 5;
  if (ONLY.has('http')) seconds += httpPlannedSeconds();
  if (ONLY.has('decisions')) seconds += decisionsPlannedSeconds();
  if (ONLY.has('promise')) seconds += promisePlannedSeconds();
  if (ONLY.has('leases')) seconds += leasesPlannedSeconds();
  if (ONLY.has('instructions')) seconds += instructionsPlannedSeconds();
  if (ONLY.has('starved')) seconds += starvedPlannedSeconds();
  if (ONLY.has('acquire')) seconds += acquirePlannedSeconds();
  if (ONLY.has('failure-mode')) seconds += failureModePlannedSeconds();
  if (ONLY.has('concurrency')) seconds += concurrencyPlannedSeconds();
  return seconds;
}

function method(): BenchResults['method'] {
  return {
    redis:
      'A redis-server started by the run on a free port (--save "" --appendonly no), used by every process of the run and stopped at the end, ' +
      'unless BENCH_REDIS_URL names an existing one. INFO cpu and INFO commandstats are server-wide: on a server of its own they count only the bench.',
    http:
      `Each variant is its own Nest 12 Express app process (logger errors only) with GET /allowed (a limit nobody reaches) and GET /denied ` +
      `(${LIMITS.denied.capacity} per second, exceeded by the load); autocannon runs in the bench process, ${SETTINGS.connections} connections, ` +
      `${SETTINGS.httpWarmupSeconds} s warm-up then ${SETTINGS.httpSeconds} s measured, variants interleaved (rotated order) over ${SETTINGS.httpRounds} rounds. ` +
      `req/s is autocannon's mean per second; p50/p99 come from every answer's response time (sub-ms resolution); ratios and the p99 ` +
      `added are taken inside each round (to "no limiter" and to the path's floor). Redis CPU per request: INFO cpu over the measured part.`,
    decisions:
      `One process per limiter keeps ${SETTINGS.inFlight} calls in flight over ${SETTINGS.decisionKeys} keys (a limit nobody reaches) for ` +
      `${SETTINGS.decisionWarmupSeconds} s warm-up and ${SETTINGS.decisionSeconds} s measured, limiters interleaved (rotated order) over ` +
      `${SETTINGS.decisionRounds} rounds. Redis CPU per decision: INFO cpu (main thread user+sys) over exactly the measured part (the worker ` +
      `starts on a signal sent after the counters were read)${EXTERNAL_REDIS ? ', minus the background rate measured for 0.4 s before' : ''}. ` +
      `Script cost: INFO commandstats (calls and usec of EVALSHA / EVAL) diffed over the same part. Then ${SETTINGS.latencySeconds} s of one ` +
      `call at a time: the p50 / p99 of a lone decision.`,
    memory: `${SETTINGS.memoryBuckets} buckets created with one decision each; MEMORY USAGE (SAMPLES 0) of every key they left, summed, divided by the buckets.`,
    promise:
      `${SETTINGS.promiseProcesses} processes × ${SETTINGS.promiseInFlight} calls in flight on one key for ${SETTINGS.promiseSeconds} s, each limiter set to 100 per second ` +
      `in its own terms; allowed replies are time-stamped on arrival. Then the boundary probe on a fresh key: one request opens a window, ` +
      `and all processes saturate from ${PROBE_OPEN_MS} ms to ${PROBE_OPEN_MS + PROBE_LENGTH_MS} ms after it. Each limiter is judged by its own ` +
      `documented semantics (one builder, bench/promise-step.ts, given each limiter's bounds); the "100 per second" table reads the same ` +
      `runs with a sliding clock. Ours runs through BucketService with default options (deny cache and coalescing on).`,
    denyCache:
      'After Redis denies a bucket, the instance keeps {tokens Redis returned, when the request was sent}; until tokens + R·elapsed (+1 ms for TIME ' +
      'truncation) could cover a cost it denies that cost without a Redis call. At most 10,000 buckets per instance (oldest out), ' +
      'cleared by reset() on this instance; a reset() on another instance is not seen.',
  };
}

async function main(): Promise<void> {
  const t = Date.now();
  if (!EXTERNAL_REDIS) {
    ownRedis = await startOwnRedis();
    // Every child process (apps, workers) inherits it.
    process.env.BENCH_REDIS_URL = ownRedis.url;
  }
  const url = ownRedis?.url ?? EXTERNAL_REDIS!;
  const redis = new Redis(url, { maxRetriesPerRequest: 1 });
  redis.on('error', () => undefined);
  try {
    await redis.ping();
  } catch (error) {
    throw new Error(`No Redis at ${url} (${(error as Error).message})`);
  }
  const redisVersion = /redis_version:(\S+)/.exec(await redis.info('server'))?.[1] ?? 'unknown';
  const estimate = planSeconds(plan());
  console.log(
    `bench: Redis ${redisVersion} at ${url} (${ownRedis ? 'started for this run' : 'BENCH_REDIS_URL, shared'}), keys under ${RUN_PREFIX}; ` +
      `steps: ${[...ONLY].join(', ')}; estimated ${estimate} (set BENCH_ROUNDS, BENCH_SECONDS, ... to change; see bench/settings.ts)`,
  );
  const cpu = cpus();
  let acquire: Awaited<ReturnType<typeof acquireStep>> | undefined;
  let leases: Awaited<ReturnType<typeof leasesStep>> | undefined;
  let failureMode: Awaited<ReturnType<typeof failureModeStep>> | undefined;
  let concurrency: Awaited<ReturnType<typeof concurrencyStep>> | undefined;
  const results: BenchResults = {
    schema: 2,
    date: new Date().toISOString().slice(0, 10),
    startedAt: new Date(startedAt).toISOString(),
    durationSeconds: 0,
    machine: {
      cpu: cpu[0]?.model.trim() ?? 'unknown',
      cores: cpu.length,
      memoryGb: round(totalmem() / 2 ** 30, 1),
      os: `${type()} ${release()}`,
      node: process.version,
      redis: redisVersion,
      redisServer: ownRedis ? 'own' : 'external',
      loadAverageAtStart: loadavg().map((n) => round(n, 2)),
      loadAverageAtEnd: [],
      note: process.env.BENCH_NOTE ?? '',
    },
    settings: { ...SETTINGS },
    limits: Object.fromEntries(Object.entries(LIMITS).map(([k, v]) => [k, { ...v }])),
    algorithms: ALGORITHMS,
    method: method(),
    http: { runs: [], summary: { allowed: {}, denied: {} } },
    decisions: { runs: [], summary: {} },
    promise: {},
    targets: [],
  };
  progress('setup', `Redis answers; machine ${results.machine.cpu} × ${results.machine.cores}`, Date.now() - t);

  try {
    if (ONLY.has('http')) {
      const http = await httpStep(redis, RUN_PREFIX, ROOT);
      results.http = { runs: http.runs, summary: http.summary };
      results.method.http += ` Start-up checks: ${Object.entries(http.checks)
        .map(([v, c]) => `${v}: ${c}`)
        .join('; ')}.`;
    }
    if (ONLY.has('decisions')) {
      results.decisions = await decisionsStep(redis, RUN_PREFIX, ownRedis === undefined);
      const baseline = results.decisions.baseline;
      if (baseline !== undefined) {
        results.algorithms[baseline.limiter] =
          `ours as above (BucketService.consume, created exactly as ours is), from the library of BENCH_BASELINE=${baseline.side}: ` +
          'a commit is taken with git archive and built in .bench-tmp/trees/<sha>/, and the worker runs from a copy of the bench beside a copy of that package';
      }
    }
    if (ONLY.has('promise')) results.promise = await promiseStep(RUN_PREFIX);
    if (ONLY.has('leases')) leases = await leasesStep(redis, RUN_PREFIX);
    if (ONLY.has('acquire')) acquire = await acquireStep(redis, RUN_PREFIX);
    if (ONLY.has('failure-mode')) failureMode = await failureModeStep(RUN_PREFIX);
    // Its callgrind part starts a redis-server of its own under valgrind, after its HTTP part.
    if (ONLY.has('concurrency')) concurrency = await concurrencyStep(redis, RUN_PREFIX, ROOT);
    // After the load steps, which its valgrind processes would disturb.
    if (ONLY.has('instructions')) results.instructions = await instructionsStep(RUN_PREFIX, ROOT);
    // Last: its busy loops must not disturb the other steps.
    if (ONLY.has('starved')) results.starved = await starvedStep(redis, RUN_PREFIX, ROOT);
  } finally {
    await Promise.all(liveChildren().map((child) => stopChild(child, 'SIGKILL')));
    if (!ownRedis) console.log(`[cleanup] deleted ${await deleteKeys(redis, `${RUN_PREFIX}*`)} keys under ${RUN_PREFIX}`);
    await redis.quit();
    await ownRedis?.stop();
  }

  results.machine.loadAverageAtEnd = loadavg().map((n) => round(n, 2));
  results.durationSeconds = round((Date.now() - startedAt) / 1000, 1);
  mkdirSync(RESULTS_DIR, { recursive: true });
  const machineLine = `Machine: ${results.machine.cpu} × ${results.machine.cores}, ${results.machine.os}, Node ${results.machine.node}, Redis ${results.machine.redis} (${results.machine.redisServer}), load average ${results.machine.loadAverageAtStart.join(' ')} at the start, ${results.machine.loadAverageAtEnd.join(' ')} at the end. ${results.machine.note}`;
  if (leases) {
    const leasesBase = join(RESULTS_DIR, `${process.env.BENCH_OUT ?? results.date}-leases`);
    const m = results.machine;
    const footer = `${results.date} · ${m.cpu}, ${m.cores} cores · ${m.os} · Node ${m.node} · Redis ${m.redis} (${m.redisServer}) · apps, Redis and load generator on the same machine`;
    writeFileSync(
      `${leasesBase}.json`,
      `${JSON.stringify({ machine: results.machine, algorithms: LEASES_ALGORITHMS, ...leases }, null, 2)}\n`,
    );
    writeFileSync(`${leasesBase}.svg`, renderLeasesChart(leases, footer));
    const markdown = `${renderLeases(leases, '#', `${basename(leasesBase)}.svg`)}\n${machineLine}\n`;
    writeFileSync(`${leasesBase}.md`, markdown);
    console.log('');
    console.log(markdown);
    console.log(`wrote ${relative(ROOT, leasesBase)}.{json,md,svg}`);
    if (!MAIN_STEPS.some((step) => ONLY.has(step)) && !concurrency && !failureMode && !acquire && !results.instructions && !results.starved)
      return;
  }
  if (concurrency) {
    const concurrencyBase = join(RESULTS_DIR, `${process.env.BENCH_OUT ?? results.date}-concurrency`);
    writeFileSync(`${concurrencyBase}.json`, `${JSON.stringify({ machine: results.machine, ...concurrency }, null, 2)}\n`);
    const markdown = `${renderConcurrency(concurrency, '#')}\n${machineLine}\n`;
    writeFileSync(`${concurrencyBase}.md`, markdown);
    console.log('');
    console.log(markdown);
    console.log(`wrote ${relative(ROOT, concurrencyBase)}.{json,md}`);
    if (!MAIN_STEPS.some((step) => ONLY.has(step)) && !failureMode && !acquire && !results.instructions && !results.starved) return;
  }
  if (failureMode) {
    const failureModeBase = join(RESULTS_DIR, `${process.env.BENCH_OUT ?? results.date}-failure-mode`);
    writeFileSync(`${failureModeBase}.json`, `${JSON.stringify({ machine: results.machine, ...failureMode }, null, 2)}\n`);
    const markdown = `${renderFailureMode(failureMode, '#')}\nMachine: ${results.machine.cpu} × ${results.machine.cores}, ${results.machine.os}, Node ${results.machine.node}, Redis ${results.machine.redis} (${results.machine.redisServer}), load average ${results.machine.loadAverageAtStart.join(' ')} at the start. ${results.machine.note}\n`;
    writeFileSync(`${failureModeBase}.md`, markdown);
    console.log('');
    console.log(markdown);
    console.log(`wrote ${relative(ROOT, failureModeBase)}.{json,md}`);
    if (!MAIN_STEPS.some((step) => ONLY.has(step)) && !acquire && !results.instructions && !results.starved) return;
  }
  if (acquire) {
    const acquireBase = join(RESULTS_DIR, `${process.env.BENCH_OUT ?? results.date}-acquire`);
    writeFileSync(`${acquireBase}.json`, `${JSON.stringify({ machine: results.machine, ...acquire }, null, 2)}\n`);
    const markdown = `${renderAcquire(acquire, '#')}\nMachine: ${results.machine.cpu} × ${results.machine.cores}, ${results.machine.os}, Node ${results.machine.node}, Redis ${results.machine.redis} (${results.machine.redisServer}), load average ${results.machine.loadAverageAtStart.join(' ')} at the start. ${results.machine.note}\n`;
    writeFileSync(`${acquireBase}.md`, markdown);
    console.log('');
    console.log(markdown);
    console.log(`wrote ${relative(ROOT, acquireBase)}.{json,md}`);
    if (!MAIN_STEPS.some((step) => ONLY.has(step)) && !results.instructions && !results.starved) return;
  }
  if (results.instructions) {
    const instructionsBase = join(RESULTS_DIR, `${process.env.BENCH_OUT ?? results.date}-instructions`);
    const instructions = { machine: results.machine, ...results.instructions };
    writeFileSync(`${instructionsBase}.json`, `${JSON.stringify(instructions, null, 2)}\n`);
    const markdown = `${renderInstructions(results.instructions, '#')}\nMachine: ${results.machine.cpu} × ${results.machine.cores}, ${results.machine.os}, Node ${results.machine.node}, Redis ${results.machine.redis} (${results.machine.redisServer}). ${results.machine.note}\n`;
    writeFileSync(`${instructionsBase}.md`, markdown);
    console.log('');
    console.log(markdown);
    console.log(`wrote ${relative(ROOT, instructionsBase)}.{json,md}`);
    if (!MAIN_STEPS.some((step) => ONLY.has(step)) && !results.starved) return;
  }
  if (results.starved) {
    const starvedBase = join(RESULTS_DIR, `${process.env.BENCH_OUT ?? results.date}-starved`);
    const starved = { machine: results.machine, ...results.starved };
    writeFileSync(`${starvedBase}.json`, `${JSON.stringify(starved, null, 2)}\n`);
    const markdown = `${renderStarved(results.starved, '#')}\nMachine: ${results.machine.cpu} × ${results.machine.cores}, ${results.machine.os}, Node ${results.machine.node}, Redis ${results.machine.redis} (${results.machine.redisServer}). ${results.machine.note}\n`;
    writeFileSync(`${starvedBase}.md`, markdown);
    console.log('');
    console.log(markdown);
    console.log(`wrote ${relative(ROOT, starvedBase)}.{json,md}`);
    // Run alone: the other steps' files would be empty.
    if (!MAIN_STEPS.some((step) => ONLY.has(step))) return;
  }
  results.targets = targets(results);
  // A subset run must not overwrite the day's full results.
  const partial = !MAIN_STEPS.every((step) => ONLY.has(step)) || process.env.BENCH_VARIANTS !== undefined || BASELINE !== undefined;
  const base = join(RESULTS_DIR, process.env.BENCH_OUT ?? `${results.date}${partial ? '-partial' : ''}`);
  writeFileSync(`${base}.json`, `${JSON.stringify(results, null, 2)}\n`);
  writeFileSync(`${base}.svg`, renderChart(results));
  writeFileSync(`${base}.md`, renderReport(results, `${basename(base)}.svg`));
  console.log('');
  console.log(readFileSync(`${base}.md`, 'utf8').split('\n## What each limiter does')[0]);
  console.log(`wrote ${relative(ROOT, base)}.{json,svg,md} in ${elapsed()}`);
  for (const target of results.targets) {
    const mark = target.verdict === 'met' ? 'met         ' : target.verdict === 'missed' ? 'MISSED      ' : 'within noise';
    const f = target.figure;
    const figure = f.n > 1 ? `${f.median} (${f.min}–${f.max})` : String(f.median);
    console.log(`target ${mark} [${target.item}] ${target.name}: ${target.goal} (measured ${figure} ${target.unit}; ${target.detail})`);
  }
}

for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.once(signal, () => {
    for (const child of liveChildren()) child.kill('SIGKILL');
    if (ownRedis) {
      // Closing its wrapper's stdin stops the server (so does this process exiting).
      void ownRedis.stop().finally(() => {
        console.error('bench interrupted; its redis-server is stopped');
        process.exit(130);
      });
      return;
    }
    const redis = new Redis(EXTERNAL_REDIS!, { maxRetriesPerRequest: 1 });
    redis.on('error', () => undefined);
    void deleteKeys(redis, `${RUN_PREFIX}*`)
      .then((n) => console.error(`bench interrupted; deleted ${n} keys under ${RUN_PREFIX}`))
      .catch(() => console.error(`bench interrupted; keys under ${RUN_PREFIX} may remain`))
      .finally(() => process.exit(130));
  });
}

main().catch(async (error: unknown) => {
  console.error(error);
  await Promise.all(liveChildren().map((child) => stopChild(child, 'SIGKILL')));
  await ownRedis?.stop();
  process.exitCode = 1;
});
