import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { getPriority, loadavg } from 'node:os';
import { setTimeout as sleep } from 'node:timers/promises';
import autocannon from 'autocannon';
import type { Redis } from 'ioredis';
import { fmt, forkWorker, nextMessage, progress, stopChild, track } from './processes.js';
import { commandStats, redisCpuSeconds, scriptCost } from './redis.js';
import type { StarvedResult, StarvedRun, StarvedSummary } from './results.js';
import { STARVED } from './settings.js';
import type { StarvedAppMessage, StarvedAppReply } from './starved-app.js';
import type { ProbeReply } from './starved-probe.js';
import { quantile, round, spreadOf } from './stats.js';

/**
 * The starved step (issue 20, item 1, last proof): does our app with default options and failureMode
 * 'open' (the previous default; timeoutMs 100) admit requests without a decision when the machine is starved of CPU, and
 * when it does, was Redis itself late? Not a test: nothing is asserted, the figures are reported.
 *
 * - one app process of ours (starved-app.ts): GET /limited, 5 tokens per client IP refilled one per
 *   1000 s, an onDecision listener counting decisions by source and admissions per identity;
 * - a separate probe process (starved-probe.ts): a PING every 10 ms on a connection of its own;
 * - autocannon in this process: STARVED.connections connections on /limited, every STARVED.perIdentity
 *   consecutive requests from one new X-Forwarded-For address (so a client's requests arrive together
 *   and share script calls), each phase with addresses of its own (its buckets start full);
 * - rounds of one quiet phase and one 'cpu' phase (order alternating), the latter with STARVED.hogs
 *   busy loops (`sh` arithmetic, the bench's own niceness) beside the app, Redis, the probe and the
 *   load generator, started a second before the phase and killed after it.
 *
 * The busy loops check that the bench process is still alive (`kill -0 $PPID`) between bursts of work,
 * so they end by themselves if the bench is killed without cleaning up; the app and the probe exit when
 * their IPC channel closes; the redis-server is the run's own (see redis.ts).
 */

/** A busy loop: pure shell arithmetic, and a check every 100,000 iterations that the bench still runs. */
const HOG = 'while kill -0 $PPID 2>/dev/null; do i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done; done';

export function starvedPlannedSeconds(): number {
  return 10 + STARVED.rounds * 2 * (STARVED.seconds + 2.5);
}

function startHogs(count: number): ChildProcess[] {
  return Array.from({ length: count }, () => track(spawn('sh', ['-c', HOG], { stdio: 'ignore' })));
}

async function ask<T>(child: ChildProcess, message: StarvedAppMessage | { type: 'reset' | 'stats' }, what: string): Promise<T> {
  const reply = nextMessage<T>(child, what, 30_000);
  child.send(message);
  return reply;
}

interface Load {
  requests: number;
  requestsPerSecond: number;
  statuses: Map<number, number>;
  errors: number;
  p50Ms: number;
  p99Ms: number;
}

/** autocannon on /limited; the n-th request comes from identity ⌊n / perIdentity⌋ of network 10.<net>.0.0/16. */
async function load(url: string, net: number, seconds: number): Promise<Load> {
  let n = 0;
  const latencies: number[] = [];
  const statuses = new Map<number, number>();
  const instance = autocannon({
    url,
    connections: STARVED.connections,
    duration: seconds,
    requests: [
      {
        method: 'GET',
        path: '/limited',
        setupRequest: (request) => {
          const id = Math.floor(n++ / STARVED.perIdentity);
          request.headers = { ...request.headers, 'x-forwarded-for': `10.${net}.${(id >> 8) & 255}.${id & 255}` };
          return request;
        },
      },
    ],
  });
  instance.on('response', (_client, status, _bytes, responseTime) => {
    statuses.set(status, (statuses.get(status) ?? 0) + 1);
    latencies.push(responseTime);
  });
  const result = await instance;
  return {
    requests: result['2xx'] + result.non2xx,
    requestsPerSecond: result.requests.average,
    statuses,
    errors: result.errors + result.timeouts,
    p50Ms: round(quantile(latencies, 0.5), 2),
    p99Ms: round(quantile(latencies, 0.99), 2),
  };
}

/** Five tokens per identity, and the address of X-Forwarded-For is the identity (trust proxy). */
async function check(url: string): Promise<string> {
  const get = (ip: string) => fetch(`${url}/limited`, { headers: { 'x-forwarded-for': ip } });
  const statuses: number[] = [];
  for (let i = 0; i < STARVED.capacity + 2; i++) statuses.push((await get('10.255.0.1')).status);
  const other = await get('10.255.0.2');
  const admitted = statuses.filter((s) => s === 200).length;
  if (admitted !== STARVED.capacity || other.status !== 200 || other.headers.get('x-ratelimit-limit') !== String(STARVED.capacity)) {
    throw new Error(
      `starved app: one client got ${statuses.join(',')}, another ${other.status}; expected ${STARVED.capacity} × 200, then 429, then 200`,
    );
  }
  return `one client ${statuses.join(',')}, another client 200, X-RateLimit-Limit ${STARVED.capacity}`;
}

function code(root: string): string {
  if (process.env.BENCH_CODE) return process.env.BENCH_CODE;
  try {
    const head = execFileSync('git', ['rev-parse', '--short', 'HEAD'], { cwd: root, encoding: 'utf8' }).trim();
    const dirty = execFileSync('git', ['status', '--porcelain', '--', 'libs'], { cwd: root, encoding: 'utf8' }).trim();
    return dirty ? `${head} with uncommitted changes in libs/` : head;
  } catch {
    return 'unknown (not a git checkout; set BENCH_CODE)';
  }
}

export async function starvedStep(redis: Redis, runPrefix: string, root: string): Promise<StarvedResult> {
  const t0 = Date.now();
  const app = forkWorker('starved-app.js', [`${runPrefix}starved:`]);
  const probe = forkWorker('starved-probe.js', []);
  let hogs: ChildProcess[] = [];
  const stopHogs = async () => {
    await Promise.all(hogs.map((hog) => stopChild(hog, 'SIGKILL')));
    hogs = [];
  };
  try {
    const [{ port }] = await Promise.all([
      nextMessage<{ port: number }>(app, 'the starved app to listen', 30_000),
      nextMessage<{ type: 'ready' }>(probe, 'the probe to connect', 30_000),
    ]);
    const url = `http://127.0.0.1:${port}`;
    const checked = await check(url);
    // Warm-up (JIT, connections) on addresses no phase uses: a cold app is not what is measured here.
    await load(url, 250, 2);
    progress('starved', `app and probe started; check: ${checked}; warmed up 2 s`, Date.now() - t0, 10);

    const runs: StarvedRun[] = [];
    let hogNice = Number.NaN;
    for (let r = 0; r < STARVED.rounds; r++) {
      const order: StarvedRun['load'][] = r % 2 === 0 ? ['quiet', 'cpu'] : ['cpu', 'quiet'];
      for (const kind of order) {
        const t = Date.now();
        if (kind === 'cpu') {
          hogs = startHogs(STARVED.hogs);
          await sleep(1_000);
          hogNice = getPriority(hogs[0].pid);
        }
        await ask(app, { type: 'reset' }, 'app reset');
        await ask(probe, { type: 'reset' }, 'probe reset');
        const cpu0 = await redisCpuSeconds(redis);
        const commands0 = await commandStats(redis);
        const started = performance.now();
        const measured = await load(url, 1 + runs.length, STARVED.seconds);
        const { stats: probed, pings } = await ask<ProbeReply>(probe, { type: 'stats' }, 'probe stats');
        const seconds = (performance.now() - started) / 1000;
        const cpu = (await redisCpuSeconds(redis)) - cpu0;
        const cost = scriptCost(commands0, await commandStats(redis));
        const loadAverage = loadavg()[0];
        await stopHogs();
        // Decisions of requests still in flight when the load stopped.
        await sleep(500);
        const boundPerIdentity = Math.floor(STARVED.capacity + STARVED.refillPerSecond * (seconds + 1));
        const { stats, failedAt, storeFailed } = await ask<StarvedAppReply>(app, { type: 'stats', boundPerIdentity }, 'app stats');
        const status = (code: number) => measured.statuses.get(code) ?? 0;
        const run: StarvedRun = {
          round: r + 1,
          load: kind,
          hogs: kind === 'cpu' ? STARVED.hogs : 0,
          seconds: round(seconds, 1),
          client: {
            requests: measured.requests,
            requestsPerSecond: round(measured.requestsPerSecond, 0),
            status2xx: status(200),
            status429: status(429),
            otherStatus: measured.requests - status(200) - status(429),
            errors: measured.errors,
            p50Ms: measured.p50Ms,
            p99Ms: measured.p99Ms,
          },
          boundPerIdentity,
          app: stats,
          redis: {
            ...probed,
            cpuPercent: round((cpu / seconds) * 100, 1),
            scriptCalls: cost.calls,
            scriptUsecPerCall: round(cost.usec / Math.max(1, cost.calls), 1),
          },
          failedDecisions: failedAt.length,
          timedOut: judgeByProbe(storeFailed, pings),
          loadAverage: round(loadAverage, 2),
        };
        runs.push(run);
        progress(`starved ${runs.length}/${STARVED.rounds * 2}`, describe(run), Date.now() - t, STARVED.seconds + 2.5);
      }
    }
    return {
      date: new Date().toISOString().slice(0, 10),
      code: code(root),
      settings: { ...STARVED, hogNice, benchNice: getPriority() },
      method: method(),
      runs,
      summary: { quiet: summarize(runs.filter((run) => run.load === 'quiet')), cpu: summarize(runs.filter((run) => run.load === 'cpu')) },
    };
  } finally {
    await stopHogs();
    await Promise.all([stopChild(app, 'SIGKILL'), stopChild(probe, 'SIGKILL')]);
  }
}

/**
 * What the probe saw while each failed store call waited, from asked for to failed (see StarvedRun.timedOut):
 * late, when one of its PINGs in flight then took more than timeoutMs; prompt, when it had a PING in flight
 * at every moment of the wait (no gap over two periods) and each was answered within timeoutMs; otherwise
 * blind (the probe itself was not running for part of the wait, so a stall of Redis could hide there).
 */
function judgeByProbe(failed: readonly [number, number][], pings: readonly [number, number][]): StarvedRun['timedOut'] {
  const late = STARVED.defaultTimeoutMs;
  const maxGap = 2 * STARVED.probeEveryMs;
  const verdict = { total: failed.length, probeLate: 0, probePrompt: 0, probeBlind: 0 };
  for (const [queued, at] of failed) {
    const during = pings.filter(([sent, answered]) => sent <= at && answered >= queued).sort((a, b) => a[0] - b[0]);
    if (during.some(([sent, answered]) => answered - sent > late)) {
      verdict.probeLate++;
      continue;
    }
    let covered = queued;
    let gap = false;
    for (const [sent, answered] of during) {
      if (sent - covered > maxGap) gap = true;
      covered = Math.max(covered, answered);
    }
    if (gap || at - covered > maxGap) verdict.probeBlind++;
    else verdict.probePrompt++;
  }
  return verdict;
}

const timedOutText = (t: StarvedRun['timedOut']) =>
  t.total === 0 ? '0' : `${t.total}: probe late ${t.probeLate}, prompt ${t.probePrompt}, blind ${t.probeBlind}`;

function describe(run: StarvedRun): string {
  const a = run.app;
  const p = run.redis;
  return (
    `round ${run.round} ${run.load === 'cpu' ? `${run.hogs} busy loops` : 'quiet'}: ${fmt(run.client.requests)} requests ` +
    `(${fmt(run.client.requestsPerSecond)}/s), ${fmt(a.admitted)} admitted, ${a.admittedBySource.open ?? 0} without a decision, ` +
    `${a.admittedBeyondPromise} beyond the promise (${a.identitiesOverPromise} of ${fmt(a.identities)} identities); ` +
    `${run.failedDecisions} fell to failureMode, of which timed out ${timedOutText(run.timedOut)}; ` +
    `by source ${sources(a.bySource)}; Redis by the probe p50 ${p.p50Ms} / p99 ${p.p99Ms} / max ${p.maxMs} ms, ` +
    `${p.over100Ms} of ${fmt(p.probes + p.pending)} over 100 ms (probe's own timer lag max ${p.lagMaxMs} ms); app loop delay max ${a.loopDelayMaxMs} ms`
  );
}

const SOURCES = ['store', 'cache', 'open', 'closed', 'local'];

function sources(bySource: Record<string, number>): string {
  return (
    SOURCES.filter((s) => bySource[s])
      .map((s) => `${s} ${fmt(bySource[s])}`)
      .join(', ') || 'none'
  );
}

function summarize(runs: readonly StarvedRun[]): StarvedSummary {
  const sum = (of: (run: StarvedRun) => number) => runs.reduce((n, run) => n + of(run), 0);
  const bySource: Record<string, number> = {};
  for (const run of runs) for (const [s, n] of Object.entries(run.app.bySource)) bySource[s] = (bySource[s] ?? 0) + n;
  return {
    rounds: runs.length,
    requests: sum((run) => run.client.requests),
    admitted: sum((run) => run.app.admitted),
    admittedWithoutDecision: sum((run) => run.app.admittedBySource.open ?? 0),
    admittedBeyondPromise: sum((run) => run.app.admittedBeyondPromise),
    failedDecisions: sum((run) => run.failedDecisions),
    timedOut: {
      total: sum((run) => run.timedOut.total),
      probeLate: sum((run) => run.timedOut.probeLate),
      probePrompt: sum((run) => run.timedOut.probePrompt),
      probeBlind: sum((run) => run.timedOut.probeBlind),
    },
    identities: sum((run) => run.app.identities),
    identitiesOverPromise: sum((run) => run.app.identitiesOverPromise),
    decisionsBySource: bySource,
    redisP50Ms: spreadOf(
      runs.map((run) => run.redis.p50Ms),
      2,
    ),
    redisP99Ms: spreadOf(
      runs.map((run) => run.redis.p99Ms),
      2,
    ),
    redisMaxMs: round(Math.max(...runs.map((run) => run.redis.maxMs)), 2),
    redisOver100Ms: sum((run) => run.redis.over100Ms),
    probes: sum((run) => run.redis.probes + run.redis.pending),
    appLoopDelayMaxMs: round(Math.max(...runs.map((run) => run.app.loopDelayMaxMs)), 2),
  };
}

function method(): string {
  return (
    `One Nest 12 Express app of ours with the module's default options but failureMode 'open' (the previous default; timeoutMs 100, deny cache and coalescing on), ` +
    `trust proxy on, GET /limited limited to ${STARVED.capacity} tokens per client IP refilled ${STARVED.refillPerSecond} per second ` +
    `(so each client's promise over a phase is ${STARVED.capacity}); its onDecision listener counts every decision by source and the ` +
    `admissions of each identity. autocannon in the bench process: ${STARVED.connections} connections for ${STARVED.seconds} s per phase, ` +
    `every ${STARVED.perIdentity} consecutive requests from a new X-Forwarded-For address (new addresses in every phase, so every bucket starts full). ` +
    `A separate probe process sends one PING every ${STARVED.probeEveryMs} ms on its own ioredis connection over the same phase, timed from ` +
    `the call to the reply; it is starved like everything else, so its own timer lag is reported beside it. ${STARVED.rounds} rounds of one ` +
    `quiet phase and one with ${STARVED.hogs} busy loops (sh arithmetic at the bench's niceness) beside the app, Redis, the probe and the ` +
    `load generator, order alternating. "Without a decision": admissions with source 'open' (the store failed or was late, and failureMode let ` +
    `the request through). "Beyond the promise": for each identity, admissions minus ${STARVED.capacity} when positive, summed. ` +
    `Admissions without a decision are of two kinds: decisions that asked Redis and had no answer within ${STARVED.defaultTimeoutMs} ms ` +
    `of their write ("timed out", from the module's store-call events, an internal hook its metrics use, which give the failure's time ` +
    `and how long since the decision was asked for), and decisions the open breaker sent to failureMode without asking. Each timed-out ` +
    `one is judged by the probe over its wait, from asked to failed (one epoch clock): "late" when a probe PING in flight then took more ` +
    `than ${STARVED.defaultTimeoutMs} ms; "prompt" when the probe had a PING in flight at every moment of the wait (no gap over ` +
    `${2 * STARVED.probeEveryMs} ms) and each was answered within ${STARVED.defaultTimeoutMs} ms, so Redis kept answering the probe while ` +
    `the decision waited; "blind" otherwise (the probe itself did not run for part of the wait, so a stall of Redis could hide there).`
  );
}

/** The step's results as markdown (its own file, and a section of the full run's report). */
export function renderStarved(result: StarvedResult, heading = '##'): string {
  const lines: string[] = [];
  const cell = (n: number) => (Number.isFinite(n) ? n.toLocaleString('en-US') : 'n/a');
  lines.push(`${heading} Starved: ${result.settings.hogs} CPU-bound processes beside the app and Redis (issue 20, item 1)`, '');
  lines.push(`Code: ${result.code}. ${result.method}`, '');
  lines.push(
    '| round | load | requests (req/s) | admitted | without a decision (open) | beyond the promise (identities over / all) | decisions by source | timed out (asked Redis): while the probe saw Redis late / prompt / probe blind | Redis by the probe p50 / p99 / max ms | probe replies > 100 ms | probe timer lag max ms | app loop delay p99 / max ms | Redis CPU % | load avg |',
    '|---:|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|',
  );
  for (const run of result.runs) {
    const a = run.app;
    const p = run.redis;
    lines.push(
      `| ${run.round} | ${run.load === 'cpu' ? `${run.hogs} busy loops` : 'quiet'} | ${cell(run.client.requests)} (${cell(run.client.requestsPerSecond)}) | ` +
        `${cell(a.admitted)} | ${cell(a.admittedBySource.open ?? 0)} | ${cell(a.admittedBeyondPromise)} (${cell(a.identitiesOverPromise)} / ${cell(a.identities)}) | ` +
        `${sources(a.bySource)} | ${timedOutText(run.timedOut)} | ${p.p50Ms} / ${p.p99Ms} / ${p.maxMs} | ${p.over100Ms} of ${cell(p.probes + p.pending)} | ${p.lagMaxMs} | ` +
        `${a.loopDelayP99Ms} / ${a.loopDelayMaxMs} | ${p.cpuPercent} | ${run.loadAverage} |`,
    );
  }
  lines.push('');
  lines.push(
    '| load | requests | admitted | without a decision | beyond the promise | timed out (asked Redis) | Redis p99 by round (median, min–max) | Redis max | probe replies > 100 ms |',
    '|---|---:|---:|---:|---:|---:|---:|---:|---:|',
  );
  for (const [kind, s] of Object.entries(result.summary)) {
    lines.push(
      `| ${kind === 'cpu' ? `${result.settings.hogs} busy loops` : 'quiet'} (${s.rounds} phases) | ${cell(s.requests)} | ${cell(s.admitted)} | ${cell(s.admittedWithoutDecision)} | ` +
        `${cell(s.admittedBeyondPromise)} | ${timedOutText(s.timedOut)} | ${s.redisP99Ms.median} (${s.redisP99Ms.min}–${s.redisP99Ms.max}) ms | ${s.redisMaxMs} ms | ${s.redisOver100Ms} of ${cell(s.probes)} |`,
    );
  }
  lines.push('');
  return lines.join('\n');
}
