import type { Redis } from 'ioredis';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import type { LatencyReply, RunReply, WorkerMessage } from './decisions-worker.js';
import { benchBeside, preparePackage, ROOT } from './library-builds.js';
import { limiterPrefix } from './limiters.js';
import { fmt, forkWorker, nextMessage, progress, rotate } from './processes.js';
import { commandStats, redisCpuSeconds, scanKeys, scriptCost } from './redis.js';
import type { BenchResults, DecisionRun, DecisionSummary } from './results.js';
import { BASELINE, DECISION_FLOOR, DECISION_LIMITERS, type DecisionLimiter, SETTINGS } from './settings.js';
import { round, spreadOf } from './stats.js';

/**
 * The decisions step: one worker process per limiter, no HTTP. Per round and limiter: decisions/s at
 * `inFlight` calls, Redis CPU per decision (INFO cpu) and the script's cost (INFO commandstats) over
 * exactly the measured part, then the latency of a lone call. Then MEMORY USAGE of idle buckets.
 *
 * BENCH_BASELINE=<commit | package dir> adds `ours@<sha>`: the worker of `ours`, started from a copy
 * of the bench beside that build of the library (library-builds.ts; a commit is built first), so that
 * it creates ours exactly as `ours` is created, from the baseline's package. It runs right after `ours`
 * in every round's rotated order.
 */

interface Worker {
  name: DecisionLimiter;
  child: ReturnType<typeof forkWorker>;
}

/** About how long a commit's library takes to build (BENCH_BASELINE) on a shared 2-core machine. */
const BASELINE_BUILD_SECONDS = 40;

export function decisionsPlannedSeconds(): number {
  const perRun = SETTINGS.decisionWarmupSeconds + SETTINGS.decisionSeconds + SETTINGS.latencySeconds + 0.3;
  const limiters = DECISION_LIMITERS.length + (BASELINE ? 1 : 0);
  return 5 + (BASELINE ? BASELINE_BUILD_SECONDS : 0) + SETTINGS.decisionRounds * limiters * perRun + 2;
}

/** The limiters' workers, in the order of round 1: DECISION_LIMITERS, and the baseline's right after ours. */
function workerPlan(): { name: DecisionLimiter; limiter: string; dir?: string }[] {
  const plan: { name: DecisionLimiter; limiter: string; dir?: string }[] = DECISION_LIMITERS.map((name) => ({ name, limiter: name }));
  if (BASELINE === undefined) return plan;
  const t = Date.now();
  const built = preparePackage(BASELINE);
  const dir = benchBeside(built.dir, join(ROOT, '.bench-tmp', 'decisions', 'baseline'));
  const baseline = { name: `ours@${built.label}` as const, limiter: 'ours', dir };
  const after = plan.findIndex((p) => p.name === 'ours');
  plan.splice(after + 1, 0, baseline);
  progress('decisions', `BENCH_BASELINE=${BASELINE}: ${baseline.name} from ${built.dir}`, Date.now() - t, BASELINE_BUILD_SECONDS);
  return plan;
}

/** Redis' own CPU rate when the bench does nothing (only on a shared server: it is subtracted). */
async function backgroundRate(redis: Redis): Promise<number> {
  const idle0 = await redisCpuSeconds(redis);
  const t0 = performance.now();
  await sleep(400);
  return ((await redisCpuSeconds(redis)) - idle0) / ((performance.now() - t0) / 1000);
}

async function measure(worker: Worker, redis: Redis, roundNo: number, sharedRedis: boolean): Promise<DecisionRun> {
  const background = sharedRedis ? await backgroundRate(redis) : 0;
  const message: WorkerMessage = {
    cmd: 'run',
    inFlight: SETTINGS.inFlight,
    keys: SETTINGS.decisionKeys,
    warmupMs: SETTINGS.decisionWarmupSeconds * 1000,
    durationMs: SETTINGS.decisionSeconds * 1000,
  };
  worker.child.send(message);
  await nextMessage(worker.child, 'warm');
  const stats0 = await commandStats(redis);
  const cpu0 = await redisCpuSeconds(redis);
  const t0 = performance.now();
  const replyPromise = nextMessage<RunReply>(worker.child, 'run result');
  worker.child.send({ cmd: 'go' } satisfies WorkerMessage);
  const reply = await replyPromise;
  const cpu = (await redisCpuSeconds(redis)) - cpu0 - background * ((performance.now() - t0) / 1000);
  const cost = scriptCost(stats0, await commandStats(redis));

  const lonePromise = nextMessage<LatencyReply>(worker.child, 'latency result');
  worker.child.send({ cmd: 'latency', keys: SETTINGS.decisionKeys, durationMs: SETTINGS.latencySeconds * 1000 } satisfies WorkerMessage);
  const lone = await lonePromise;

  const decisions = Math.max(1, reply.decisions);
  const cpuUs = Math.max(0, (cpu * 1e6) / decisions);
  return {
    round: roundNo,
    limiter: worker.name,
    decisionsPerSecond: round(reply.decisions / reply.seconds, 0),
    errors: reply.errors,
    redisCpuUsPerDecision: round(cpuUs, 3),
    decisionsPerCpuSecond: round(cpuUs > 0 ? 1e6 / cpuUs : Number.NaN, 0),
    scriptCommand: cost.command,
    scriptUsecPerCall: round(cost.calls > 0 ? cost.usec / cost.calls : Number.NaN, 3),
    scriptCallsPerDecision: round(cost.calls / decisions, 4),
    scriptUsecPerDecision: round(cost.usec / decisions, 3),
    ratioToReference: Number.NaN,
    loneP50Us: round(lone.p50Us, 1),
    loneP99Us: round(lone.p99Us, 1),
  };
}

export async function decisionsStep(redis: Redis, runPrefix: string, sharedRedis: boolean): Promise<BenchResults['decisions']> {
  const plan = workerPlan();
  const t0 = Date.now();
  const workers: Worker[] = [];
  for (const { name, limiter, dir } of plan) {
    const child = forkWorker('decisions-worker.js', [limiter, limiterPrefix(`${runPrefix}dec:`, name)], dir);
    workers.push({ name, child });
    await nextMessage(child, `${name} ready`);
  }
  progress('decisions', `started ${workers.length} worker processes`, Date.now() - t0);

  const runs: DecisionRun[] = [];
  const total = SETTINGS.decisionRounds * workers.length;
  const perRun = SETTINGS.decisionWarmupSeconds + SETTINGS.decisionSeconds + SETTINGS.latencySeconds + 0.3;
  for (let r = 0; r < SETTINGS.decisionRounds; r++) {
    const inRound: DecisionRun[] = [];
    for (const worker of rotate(workers, r)) {
      const t = Date.now();
      const run = await measure(worker, redis, r + 1, sharedRedis);
      inRound.push(run);
      runs.push(run);
      progress(
        `decisions ${runs.length}/${total}`,
        `round ${r + 1} ${worker.name}: ${fmt(run.decisionsPerSecond)} decisions/s; Redis ${run.redisCpuUsPerDecision.toFixed(2)} µs CPU ` +
          `per decision (${fmt(run.decisionsPerCpuSecond)} per CPU second); ${run.scriptCommand} ${run.scriptUsecPerCall.toFixed(2)} µs per call, ` +
          `${run.scriptCallsPerDecision.toFixed(3)} calls per decision; lone call p50 ${run.loneP50Us} µs` +
          `${run.errors ? `, ${run.errors} errors` : ''}`,
        Date.now() - t,
        perRun,
      );
    }
    const floor = inRound.find((run) => run.limiter === DECISION_FLOOR)?.decisionsPerSecond ?? Number.NaN;
    for (const run of inRound) run.ratioToReference = round(run.decisionsPerSecond / floor, 4);
    console.log(
      `         round ${r + 1} ratios to the reference script: ${inRound.map((run) => `${run.limiter} ${run.ratioToReference.toFixed(3)}`).join(', ')}`,
    );
  }

  const t1 = Date.now();
  const memory = new Map<DecisionLimiter, { bytes: number; keys: number }>();
  for (const worker of workers) {
    worker.child.send({ cmd: 'memory', count: SETTINGS.memoryBuckets } satisfies WorkerMessage);
    await nextMessage(worker.child, 'memory done');
    const keys = await scanKeys(redis, `${limiterPrefix(`${runPrefix}dec:`, worker.name)}idle:*`);
    const pipeline = redis.pipeline();
    for (const key of keys) pipeline.call('MEMORY', 'USAGE', key, 'SAMPLES', '0');
    const sizes = ((await pipeline.exec()) ?? []).map(([, size]) => Number(size) || 0);
    memory.set(worker.name, { bytes: sizes.reduce((a, b) => a + b, 0), keys: keys.length });
  }
  progress(
    'memory',
    `idle buckets: ${[...memory]
      .map(([n, m]) => `${n} ${fmt(m.bytes / SETTINGS.memoryBuckets)} B in ${(m.keys / SETTINGS.memoryBuckets).toFixed(1)} key(s)`)
      .join(', ')}`,
    Date.now() - t1,
    2,
  );
  await Promise.all(
    workers.map(async (w) => {
      const exited = new Promise((done) => (w.child.exitCode !== null ? done(undefined) : w.child.once('exit', done)));
      w.child.send({ cmd: 'exit' } satisfies WorkerMessage);
      await exited;
    }),
  );

  const summary: BenchResults['decisions']['summary'] = {};
  for (const { name } of workers) {
    const mine = runs.filter((run) => run.limiter === name);
    if (mine.length === 0) continue;
    const of = (field: keyof DecisionRun, digits: number) =>
      spreadOf(
        mine.map((run) => run[field] as number),
        digits,
      );
    const s: DecisionSummary = {
      decisionsPerSecond: of('decisionsPerSecond', 0),
      ratioToReference: of('ratioToReference', 3),
      redisCpuUsPerDecision: of('redisCpuUsPerDecision', 2),
      decisionsPerCpuSecond: of('decisionsPerCpuSecond', 0),
      scriptCommand: [...new Set(mine.map((run) => run.scriptCommand))].join(', '),
      scriptUsecPerCall: of('scriptUsecPerCall', 2),
      scriptCallsPerDecision: of('scriptCallsPerDecision', 3),
      scriptUsecPerDecision: of('scriptUsecPerDecision', 2),
      loneP50Us: of('loneP50Us', 1),
      loneP99Us: of('loneP99Us', 1),
      bytesPerIdleBucket: round((memory.get(name)?.bytes ?? NaN) / SETTINGS.memoryBuckets, 1),
      keysPerIdleBucket: round((memory.get(name)?.keys ?? NaN) / SETTINGS.memoryBuckets, 2),
    };
    summary[name] = s;
  }
  const baseline = plan.find((p) => p.dir !== undefined);
  return baseline === undefined ? { runs, summary } : { runs, summary, baseline: { limiter: baseline.name, side: BASELINE! } };
}
