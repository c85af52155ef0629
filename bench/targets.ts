import type { BenchResults, DecisionRun, HttpRun, Target } from './results.js';
import { type DecisionLimiter, DECISION_PEERS, HTTP_PEERS, type HttpPath, type HttpVariant, SHORT_LABELS } from './settings.js';
import { judge, type Spread, spreadOf } from './stats.js';

/**
 * The goals of issue 11, each judged from per-round figures: a ratio or difference is computed inside
 * each round (both sides measured minutes apart at most, in the same conditions), and the verdict
 * compares the median with the goal against the spread of those per-round figures (see `judge`).
 */

/** The goal numbers, shared with the chart's target lines. */
export const GOALS = {
  scriptCostRatio: 1.1,
  decisionsToReference: 0.95,
  allowedToMinimalGuard: 0.95,
  deniedToThrowOnly: 0.97,
  p99AddedMs: 1,
  bytesPerIdleBucket: 120,
  cpuEfficiencyToBestPeer: 1.5,
  loneP50AddedUs: 0,
  /** Issue 34, item 2: ours' Redis CPU per decision within 5 % of the baseline's (BENCH_BASELINE), in the same run. */
  toBaseline: 1.05,
} as const;

const f = (n: number, digits: number) =>
  Number.isFinite(n) ? n.toLocaleString('en-US', { minimumFractionDigits: digits, maximumFractionDigits: digits }) : 'n/a';

/** Per round, `value(a, b)` of the two variants' runs on a path. */
function httpPaired(
  runs: readonly HttpRun[],
  path: HttpPath,
  a: HttpVariant,
  b: HttpVariant,
  value: (a: HttpRun, b: HttpRun) => number,
): number[] {
  const out: number[] = [];
  for (const ra of runs) {
    if (ra.path !== path || ra.variant !== a) continue;
    const rb = runs.find((r) => r.path === path && r.variant === b && r.round === ra.round);
    if (rb) out.push(value(ra, rb));
  }
  return out;
}

/** Per round, `value(a, others)` of a limiter's run and other limiters' runs of the same round. */
function decisionPaired(
  runs: readonly DecisionRun[],
  a: DecisionLimiter,
  others: readonly DecisionLimiter[],
  value: (a: DecisionRun, others: DecisionRun[]) => number,
): number[] {
  const out: number[] = [];
  for (const ra of runs) {
    if (ra.limiter !== a) continue;
    const rest = others.map((o) => runs.find((r) => r.limiter === o && r.round === ra.round));
    if (rest.every((r) => r !== undefined)) out.push(value(ra, rest as DecisionRun[]));
  }
  return out;
}

function target(
  item: string,
  name: string,
  goal: string,
  figure: Spread,
  unit: string,
  direction: 'atLeast' | 'atMost',
  threshold: number,
  detail: string,
): Target {
  return { item, name, goal, figure, unit, detail, verdict: judge(figure, direction, threshold) };
}

export function targets(results: BenchResults): Target[] {
  const list: Target[] = [];
  const d = results.decisions;
  const dRuns = d.runs;
  const ratio = (a: number, b: number) => a / b;

  // 1. Script cost, one key per call: ours without coalescing against the reference script.
  if (d.summary['ours-no-coalesce'] && d.summary.reference) {
    const ours = d.summary['ours-no-coalesce'];
    const ref = d.summary.reference;
    list.push(
      target(
        '1',
        'script cost: usec_per_call (INFO commandstats), one key per call',
        `ours (coalesce: false) ≤ ${GOALS.scriptCostRatio}× the reference script`,
        spreadOf(decisionPaired(dRuns, 'ours-no-coalesce', ['reference'], (a, [b]) => ratio(a.scriptUsecPerCall, b.scriptUsecPerCall))),
        '×',
        'atMost',
        GOALS.scriptCostRatio,
        `${f(ours.scriptUsecPerCall.median, 2)} µs vs ${f(ref.scriptUsecPerCall.median, 2)} µs per ${ref.scriptCommand}`,
      ),
      target(
        '1',
        'script cost: Redis CPU per decision (INFO cpu), one key per call',
        `ours (coalesce: false) ≤ ${GOALS.scriptCostRatio}× the reference script`,
        spreadOf(
          decisionPaired(dRuns, 'ours-no-coalesce', ['reference'], (a, [b]) => ratio(a.redisCpuUsPerDecision, b.redisCpuUsPerDecision)),
        ),
        '×',
        'atMost',
        GOALS.scriptCostRatio,
        `${f(ours.redisCpuUsPerDecision.median, 2)} µs vs ${f(ref.redisCpuUsPerDecision.median, 2)} µs`,
      ),
    );
  }

  // 2. Decisions/s of BucketService.consume (default options).
  if (d.summary.ours && d.summary.reference) {
    list.push(
      target(
        '2',
        'decisions/s, ours (default options)',
        `≥ ${GOALS.decisionsToReference} of the reference script`,
        spreadOf(decisionPaired(dRuns, 'ours', ['reference'], (a, [b]) => ratio(a.decisionsPerSecond, b.decisionsPerSecond))),
        '×',
        'atLeast',
        GOALS.decisionsToReference,
        `${f(d.summary.ours.decisionsPerSecond.median, 0)} vs ${f(d.summary.reference.decisionsPerSecond.median, 0)} decisions/s`,
      ),
    );
  }
  for (const peer of DECISION_PEERS) {
    if (!d.summary.ours || !d.summary[peer]) continue;
    list.push(
      target(
        '2',
        `decisions/s, ours vs ${SHORT_LABELS[peer]}`,
        '≥ 1× the peer',
        spreadOf(decisionPaired(dRuns, 'ours', [peer], (a, [b]) => ratio(a.decisionsPerSecond, b.decisionsPerSecond))),
        '×',
        'atLeast',
        1,
        `${f(d.summary.ours.decisionsPerSecond.median, 0)} vs ${f(d.summary[peer]!.decisionsPerSecond.median, 0)} decisions/s`,
      ),
    );
  }

  // 3. HTTP against the floors and the peers.
  const h = results.http;
  const paths: [HttpPath, HttpVariant, number][] = [
    ['allowed', 'minimal-guard', GOALS.allowedToMinimalGuard],
    ['denied', 'throw-only', GOALS.deniedToThrowOnly],
  ];
  for (const [path, floor, goal] of paths) {
    const ours = h.summary[path]?.ours;
    if (!ours) continue;
    if (h.summary[path]?.[floor]) {
      list.push(
        target(
          '3',
          `HTTP ${path} path, ours vs the floor`,
          `≥ ${goal} of ${SHORT_LABELS[floor]}`,
          spreadOf(httpPaired(h.runs, path, 'ours', floor, (a, b) => ratio(a.requestsPerSecond, b.requestsPerSecond))),
          '×',
          'atLeast',
          goal,
          `${f(ours.requestsPerSecond.median, 0)} vs ${f(h.summary[path]![floor]!.requestsPerSecond.median, 0)} req/s`,
        ),
      );
    }
    for (const peer of HTTP_PEERS) {
      const p = h.summary[path]?.[peer];
      if (!p) continue;
      list.push(
        target(
          '3',
          `HTTP ${path} path, ours vs ${SHORT_LABELS[peer]}`,
          '≥ 1× the peer',
          spreadOf(httpPaired(h.runs, path, 'ours', peer, (a, b) => ratio(a.requestsPerSecond, b.requestsPerSecond))),
          '×',
          'atLeast',
          1,
          `${f(ours.requestsPerSecond.median, 0)} vs ${f(p.requestsPerSecond.median, 0)} req/s`,
        ),
      );
    }
  }

  // 4. Latency added at the HTTP load's connections.
  for (const path of ['allowed', 'denied'] as const) {
    const ours = h.summary[path]?.ours;
    if (!ours) continue;
    list.push(
      target(
        '4',
        `p99 added over no limiter, ${path} path, ${results.settings.connections} connections`,
        `≤ ${GOALS.p99AddedMs} ms`,
        ours.p99AddedMs,
        'ms',
        'atMost',
        GOALS.p99AddedMs,
        `p99 ${f(ours.p99Ms.median, 2)} ms vs ${f(h.summary[path]!.none?.p99Ms.median ?? NaN, 2)} ms`,
      ),
    );
  }

  // 5. Memory per idle bucket.
  if (d.summary.ours) {
    const bytes = d.summary.ours.bytesPerIdleBucket;
    list.push(
      target(
        '5',
        'MEMORY USAGE per idle bucket, ours',
        `≤ ${GOALS.bytesPerIdleBucket} B`,
        spreadOf([bytes], 1),
        'B',
        'atMost',
        GOALS.bytesPerIdleBucket,
        `${f(d.summary.ours.keysPerIdleBucket, 1)} key(s) per bucket; reference ${f(d.summary.reference?.bytesPerIdleBucket ?? NaN, 0)} B`,
      ),
    );
  }

  // 6. Ours keeps its own promise (a hard bound: one violation breaks it).
  const promise = results.promise.ours;
  if (promise) {
    const worst = Math.max(...promise.own.checks.map((c) => c.measured / c.bound));
    list.push(
      target(
        '6',
        'promise, ours (token bucket bounds)',
        'most allowed / bound ≤ 1 in every check',
        spreadOf([worst], 3),
        '×',
        'atMost',
        1,
        promise.own.checks.map((c) => `${c.measured}/${c.bound}`).join(', '),
      ),
    );
  }

  // 8. Decisions per Redis CPU second against the best peer, and no added latency for a lone call.
  if (d.summary.ours && DECISION_PEERS.every((p) => d.summary[p])) {
    list.push(
      target(
        '8',
        `decisions per Redis CPU second at ${results.settings.inFlight} in flight, ours vs the best peer`,
        `≥ ${GOALS.cpuEfficiencyToBestPeer}× the best peer (per round)`,
        spreadOf(
          decisionPaired(
            dRuns,
            'ours',
            DECISION_PEERS,
            (a, peers) => a.decisionsPerCpuSecond / Math.max(...peers.map((p) => p.decisionsPerCpuSecond)),
          ),
        ),
        '×',
        'atLeast',
        GOALS.cpuEfficiencyToBestPeer,
        `${f(d.summary.ours.decisionsPerCpuSecond.median, 0)} vs ${DECISION_PEERS.map((p) => `${SHORT_LABELS[p]} ${f(d.summary[p]!.decisionsPerCpuSecond.median, 0)}`).join(', ')}`,
      ),
    );
  }
  if (d.summary.ours && d.summary['ours-no-coalesce']) {
    list.push(
      target(
        '8',
        'p50 of a lone decision (1 in flight) added by coalescing',
        'ours − ours with coalesce: false ≤ 0 µs',
        spreadOf(
          decisionPaired(dRuns, 'ours', ['ours-no-coalesce'], (a, [b]) => a.loneP50Us - b.loneP50Us),
          1,
        ),
        'µs',
        'atMost',
        GOALS.loneP50AddedUs,
        `${f(d.summary.ours.loneP50Us.median, 1)} µs vs ${f(d.summary['ours-no-coalesce'].loneP50Us.median, 1)} µs`,
      ),
    );
  }
  // Issue 34, item 2: ours against the baseline's library (BENCH_BASELINE), both measured in every round.
  const baseline = d.baseline?.limiter;
  const base = baseline !== undefined ? d.summary[baseline] : undefined;
  if (baseline !== undefined && base && d.summary.ours) {
    const ours = d.summary.ours;
    list.push(
      target(
        '34.2',
        `Redis CPU per decision (INFO cpu), ours vs ${baseline}`,
        `≤ ${GOALS.toBaseline}× the baseline's`,
        spreadOf(decisionPaired(dRuns, 'ours', [baseline], (a, [b]) => ratio(a.redisCpuUsPerDecision, b.redisCpuUsPerDecision))),
        '×',
        'atMost',
        GOALS.toBaseline,
        `${f(ours.redisCpuUsPerDecision.median, 2)} µs vs ${f(base.redisCpuUsPerDecision.median, 2)} µs`,
      ),
      target(
        '34.2',
        `script cost: usec_per_call (INFO commandstats), ours vs ${baseline}`,
        `≤ ${GOALS.toBaseline}× the baseline's`,
        spreadOf(decisionPaired(dRuns, 'ours', [baseline], (a, [b]) => ratio(a.scriptUsecPerCall, b.scriptUsecPerCall))),
        '×',
        'atMost',
        GOALS.toBaseline,
        `${f(ours.scriptUsecPerCall.median, 2)} µs vs ${f(base.scriptUsecPerCall.median, 2)} µs per call; ` +
          `${f(ours.scriptCallsPerDecision.median, 3)} vs ${f(base.scriptCallsPerDecision.median, 3)} calls per decision`,
      ),
    );
  }
  return list;
}
