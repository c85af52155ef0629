import { readFileSync, writeFileSync } from 'node:fs';
import { pathToFileURL } from 'node:url';
import type { BenchResults, DecisionSummary, PromiseResult } from './results.js';
import {
  DECISION_PEERS,
  HTTP_FLOORS,
  HTTP_PATHS,
  HTTP_PEERS,
  type DecisionLimiter,
  type HttpPath,
  limiterLabel,
  type PromiseLimiter,
  SHORT_LABELS,
} from './settings.js';
import type { Spread } from './stats.js';
import { GOALS } from './targets.js';

/**
 * Renders the results JSON as one SVG: bars are medians, whiskers the per-round min–max, dashed lines
 * the targets of issue 11 (placed from the floor's or peer's median). Plain SVG text, no dependencies.
 * `node dist/bench/chart.js bench/results/<date>.json` re-renders a saved run.
 */

const WIDTH = 1120;
const LABEL_WIDTH = 230;
const BAR_AREA = 430;
const ROW = 22;
const LINE_LABEL = 13;
const COLORS = { ours: '#1f6feb', oursVariant: '#54aeff', other: '#8c959f', none: '#d0d7de', bad: '#cf222e', floor: '#6e7781' };

export interface Row {
  label: string;
  value: number;
  /** Per-round spread: drawn as a whisker from min to max. */
  spread?: Spread;
  text: string;
  color: string;
  /** A short tick drawn at this value (a bound). */
  mark?: number;
}

export interface Line {
  at: number;
  label: string;
  style?: 'dashed' | 'dotted';
}

export function escape(text: string): string {
  return text.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');
}

export function colorOf(name: string): string {
  if (name === 'ours') return COLORS.ours;
  if (name.startsWith('ours-') || name.startsWith('ours@')) return COLORS.oursVariant;
  if (name === 'none') return COLORS.none;
  if (name === 'reference' || name === 'minimal-guard' || name === 'throw-only' || name === 'throw-later') return COLORS.floor;
  return COLORS.other;
}

export const num = (n: number, digits = 0) =>
  Number.isFinite(n) ? n.toLocaleString('en-US', { minimumFractionDigits: digits, maximumFractionDigits: digits }) : 'n/a';

/** "median (min–max)" for the value column. */
export function spreadText(s: Spread, digits = 0): string {
  return s.n > 1 && s.min !== s.max ? `${num(s.median, digits)} (${num(s.min, digits)}–${num(s.max, digits)})` : num(s.median, digits);
}

/**
 * A titled block of horizontal bars on the scale [lo, hi] (bars start at 0), whiskers, ticks and
 * labelled vertical lines; returns the SVG and its height.
 */
export function panel(
  y: number,
  title: string,
  subtitle: string,
  rows: Row[],
  lo: number,
  hi: number,
  lines: Line[] = [],
): { svg: string; height: number } {
  const parts: string[] = [];
  parts.push(`<text x="20" y="${y + 18}" class="title">${escape(title)}</text>`);
  parts.push(`<text x="20" y="${y + 35}" class="sub">${escape(subtitle)}</text>`);
  const shown = lines.filter((l) => Number.isFinite(l.at));
  const top = y + 46 + shown.length * LINE_LABEL;
  const x0 = 20 + LABEL_WIDTH;
  const xOf = (v: number) => x0 + ((Math.min(Math.max(lo, v), hi) - lo) / (hi - lo)) * BAR_AREA;
  const zero = xOf(0);
  rows.forEach((row, i) => {
    const ry = top + i * ROW;
    parts.push(`<text x="${x0 - 8}" y="${ry + 14}" class="label" text-anchor="end">${escape(row.label)}</text>`);
    if (Number.isFinite(row.value)) {
      const x = xOf(row.value);
      parts.push(
        `<rect x="${Math.min(zero, x).toFixed(1)}" y="${ry + 4}" width="${Math.abs(x - zero).toFixed(1)}" height="${ROW - 9}" fill="${row.color}" rx="2"/>`,
      );
    }
    if (row.spread && row.spread.n > 1 && Number.isFinite(row.spread.min)) {
      const a = xOf(row.spread.min).toFixed(1);
      const b = xOf(row.spread.max).toFixed(1);
      const cy = ry + ROW / 2;
      parts.push(`<line x1="${a}" x2="${b}" y1="${cy}" y2="${cy}" stroke="#24292f" stroke-width="1.2"/>`);
      for (const x of [a, b]) parts.push(`<line x1="${x}" x2="${x}" y1="${cy - 4}" y2="${cy + 4}" stroke="#24292f" stroke-width="1.2"/>`);
    }
    if (row.mark !== undefined) {
      const mx = xOf(row.mark).toFixed(1);
      parts.push(`<line x1="${mx}" x2="${mx}" y1="${ry + 1}" y2="${ry + ROW - 2}" stroke="#24292f" stroke-width="2.5"/>`);
    }
    parts.push(`<text x="${x0 + BAR_AREA + 14}" y="${ry + 14}" class="value">${escape(row.text)}</text>`);
  });
  const bottom = top + rows.length * ROW;
  parts.push(`<line x1="${zero.toFixed(1)}" x2="${zero.toFixed(1)}" y1="${top}" y2="${bottom}" stroke="#8c959f" stroke-width="1"/>`);
  shown.forEach((line, i) => {
    const lx = xOf(line.at);
    const dash = line.style === 'dotted' ? '1 3' : '5 3';
    const ly = top - 4 - (shown.length - 1 - i) * LINE_LABEL;
    parts.push(
      `<line x1="${lx.toFixed(1)}" x2="${lx.toFixed(1)}" y1="${ly + 2}" y2="${bottom}" stroke="#cf222e" stroke-dasharray="${dash}" stroke-width="1.3"/>`,
    );
    const anchor = lx > x0 + BAR_AREA * 0.6 ? 'end' : 'start';
    parts.push(
      `<text x="${(lx + (anchor === 'end' ? -4 : 4)).toFixed(1)}" y="${ly}" class="target" text-anchor="${anchor}">${escape(line.label)}</text>`,
    );
  });
  return { svg: parts.join('\n'), height: bottom - y + 6 };
}

/** A scale end a little beyond every value, whisker and line. */
export function upper(rows: Row[], lines: Line[], pad = 1.08): number {
  const values = [...rows.flatMap((r) => [r.value, r.spread?.max ?? r.value, r.mark ?? r.value]), ...lines.map((l) => l.at)];
  return Math.max(...values.filter((v) => Number.isFinite(v))) * pad || 1;
}

export function renderChart(results: BenchResults): string {
  const blocks: string[] = [];
  let y = 10;
  const add = (block: { svg: string; height: number }) => {
    blocks.push(block.svg);
    y += block.height + 16;
  };
  const s = results.settings;

  // HTTP throughput relative to no limiter, per path.
  const floorGoal: Record<HttpPath, number> = { allowed: GOALS.allowedToMinimalGuard, denied: GOALS.deniedToThrowOnly };
  for (const path of Object.keys(HTTP_PATHS) as HttpPath[]) {
    const summary = results.http.summary[path] ?? {};
    const rows: Row[] = HTTP_PATHS[path]
      .filter((v) => summary[v])
      .map((variant) => {
        const h = summary[variant]!;
        return {
          label: SHORT_LABELS[variant],
          value: h.ratio.median,
          spread: h.ratio,
          text: `${spreadText(h.ratio, 3)} · ${num(h.requestsPerSecond.median)} req/s · p99 ${num(h.p99Ms.median, 1)} ms`,
          color: colorOf(variant),
        };
      });
    if (rows.length === 0) continue;
    const floor = summary[HTTP_FLOORS[path]]?.ratio.median ?? NaN;
    const bestPeer = Math.max(...HTTP_PEERS.map((p) => summary[p]?.ratio.median ?? -Infinity));
    const lines: Line[] = [
      { at: floorGoal[path] * floor, label: `target: ${floorGoal[path]} × ${SHORT_LABELS[HTTP_FLOORS[path]]}` },
      { at: Number.isFinite(bestPeer) ? bestPeer : NaN, label: 'target: the best peer' },
    ];
    add(
      panel(
        y,
        `HTTP ${path} path: throughput relative to no limiter (median, whisker = min–max of ${s.httpRounds} rounds; higher is better)`,
        path === 'allowed'
          ? `a limit nobody reaches; Nest 12 + Express, autocannon ${s.connections} connections, ${s.httpSeconds} s per variant and round, interleaved`
          : `a limit of ${results.limits.denied?.capacity ?? 10}/s that the load exceeds several hundred times over; same app and load`,
        rows,
        0,
        Math.max(1.1, upper(rows, lines)),
        lines,
      ),
    );
  }

  // p99 added over no limiter.
  const p99Rows: Row[] = [];
  for (const path of Object.keys(HTTP_PATHS) as HttpPath[]) {
    for (const variant of HTTP_PATHS[path]) {
      const h = results.http.summary[path]?.[variant];
      if (!h || variant === 'none') continue;
      p99Rows.push({
        label: `${path}: ${SHORT_LABELS[variant]}`,
        value: h.p99AddedMs.median,
        spread: h.p99AddedMs,
        text: `${spreadText(h.p99AddedMs, 2)} ms (p99 ${num(h.p99Ms.median, 2)} ms)`,
        color: colorOf(variant),
      });
    }
  }
  if (p99Rows.length > 0) {
    const lines: Line[] = [{ at: GOALS.p99AddedMs, label: `target for ours: ≤ ${GOALS.p99AddedMs} ms` }];
    const lo = Math.min(0, ...p99Rows.map((r) => r.spread?.min ?? r.value).filter(Number.isFinite)) * 1.08;
    add(
      panel(
        y,
        `p99 latency added over no limiter, ms (${s.connections} connections; lower is better)`,
        "per round: the variant's p99 minus the same round's no-limiter p99",
        p99Rows,
        lo,
        upper(p99Rows, lines),
        lines,
      ),
    );
  }

  const decisions = Object.entries(results.decisions.summary) as [DecisionLimiter, DecisionSummary][];
  if (decisions.length > 0) {
    const d = results.decisions.summary;
    const bestPeerOf = (pick: (x: DecisionSummary) => number) => Math.max(...DECISION_PEERS.map((p) => (d[p] ? pick(d[p]!) : -Infinity)));

    const rateRows = decisions.map(([name, x]) => ({
      label: limiterLabel(name, true),
      value: x.decisionsPerSecond.median,
      spread: x.decisionsPerSecond,
      text: `${spreadText(x.decisionsPerSecond)}/s · ${num(x.ratioToReference.median, 3)} of the reference`,
      color: colorOf(name),
    }));
    const rateLines: Line[] = [
      {
        at: GOALS.decisionsToReference * (d.reference?.decisionsPerSecond.median ?? NaN),
        label: `target: ${GOALS.decisionsToReference} × the reference script`,
      },
      { at: bestPeerOf((x) => x.decisionsPerSecond.median), label: 'target: the best peer' },
    ];
    add(
      panel(
        y,
        `Decisions per second from one process (${s.inFlight} in flight; higher is better)`,
        `BucketService.consume and the peers' calls over ${num(s.decisionKeys)} keys, ${s.decisionRounds} interleaved rounds`,
        rateRows,
        0,
        upper(rateRows, rateLines),
        rateLines,
      ),
    );

    const cpuRows = decisions.map(([name, x]) => ({
      label: limiterLabel(name, true),
      value: x.decisionsPerCpuSecond.median,
      spread: x.decisionsPerCpuSecond,
      text: `${spreadText(x.decisionsPerCpuSecond)} · ${num(x.redisCpuUsPerDecision.median, 2)} µs each`,
      color: colorOf(name),
    }));
    const cpuLines: Line[] = [
      {
        at: GOALS.cpuEfficiencyToBestPeer * bestPeerOf((x) => x.decisionsPerCpuSecond.median),
        label: `target: ${GOALS.cpuEfficiencyToBestPeer} × the best peer`,
      },
    ];
    add(
      panel(
        y,
        `Decisions per Redis CPU second (INFO cpu, ${s.inFlight} in flight; higher is better)`,
        'how many decisions one fully busy Redis core makes per second',
        cpuRows,
        0,
        upper(cpuRows, cpuLines),
        cpuLines,
      ),
    );

    // Per decision: usec_per_call × calls per decision (the same as usec_per_call with one bucket per call),
    // so that ours with coalescing (several buckets per call) sits on the same scale.
    const scriptRows = decisions.map(([name, x]) => ({
      label: limiterLabel(name, true),
      value: x.scriptUsecPerDecision.median,
      spread: x.scriptUsecPerDecision,
      text: `${spreadText(x.scriptUsecPerDecision, 2)} µs · usec_per_call ${num(x.scriptUsecPerCall.median, 2)} (${x.scriptCommand}), ${num(x.scriptCallsPerDecision.median, 3)} calls per decision`,
      color: colorOf(name),
    }));
    const scriptLines: Line[] = [
      {
        at: GOALS.scriptCostRatio * (d.reference?.scriptUsecPerCall.median ?? NaN),
        label: `target for one key per call (coalesce: false): ≤ ${GOALS.scriptCostRatio} × the reference script`,
      },
    ];
    add(
      panel(
        y,
        'Script cost per decision: INFO commandstats µs of the script command (lower is better)',
        'usec_per_call × calls per decision; with one bucket per call it is usec_per_call itself',
        scriptRows,
        0,
        upper(scriptRows, scriptLines),
        scriptLines,
      ),
    );

    const memRows = decisions.map(([name, x]) => ({
      label: limiterLabel(name, true),
      value: x.bytesPerIdleBucket,
      text: `${num(x.bytesPerIdleBucket)} B in ${num(x.keysPerIdleBucket, 1)} key(s)`,
      color: colorOf(name),
    }));
    const memLines: Line[] = [{ at: GOALS.bytesPerIdleBucket, label: `target for ours: ≤ ${GOALS.bytesPerIdleBucket} B` }];
    add(
      panel(
        y,
        'Redis memory per idle bucket (MEMORY USAGE; lower is better)',
        `${num(s.memoryBuckets)} buckets, one decision each`,
        memRows,
        0,
        upper(memRows, memLines),
        memLines,
      ),
    );
  }

  const promiseRows: Row[] = [];
  for (const [name, p] of Object.entries(results.promise) as [PromiseLimiter, PromiseResult][]) {
    const [, saturated, boundary] = p.own.checks;
    promiseRows.push({
      label: `${SHORT_LABELS[name]}: saturated`,
      value: saturated.measured,
      text: `${saturated.measured} in 1 s (own bound ${saturated.bound})`,
      color: saturated.ok ? colorOf(name) : COLORS.bad,
      mark: saturated.bound,
    });
    promiseRows.push({
      label: 'across a window boundary',
      value: boundary.measured,
      text: `${boundary.measured} in 1 s (own bound ${boundary.bound}) ${p.own.kept ? '✓ own promise kept' : '✗ own promise broken'}`,
      color: boundary.ok ? colorOf(name) : COLORS.bad,
      mark: boundary.bound,
    });
  }
  if (promiseRows.length > 0) {
    const stated = Object.values(results.promise)[0]!.reader.statedPerSecond;
    const lines: Line[] = [{ at: stated, label: `"${stated} per second" as a reader takes it`, style: 'dotted' }];
    add(
      panel(
        y,
        `Most allowed in any sliding 1 s on one key (${s.promiseProcesses} processes × ${s.promiseInFlight} in flight; tick = the limiter's own bound)`,
        'token bucket 100/s with burst 100: any 1 s may see 200; fixed windows of 100 per 1 s: any 1 s may meet two windows, 200',
        promiseRows,
        0,
        upper(promiseRows, lines),
        lines,
      ),
    );
  }

  const m = results.machine;
  const footer = `${results.date} · ${m.cpu}, ${m.cores} cores, ${m.memoryGb} GB · ${m.os} · Node ${m.node} · Redis ${m.redis} (${m.redisServer}) · app, Redis and load generator on the same machine`;
  blocks.push(`<text x="20" y="${y + 4}" class="note">${escape(footer)}</text>`);
  const height = y + 16;
  return svgDocument(blocks, height);
}

/** A chart's blocks in an SVG document of the charts' width and styles, `height` px high. */
export function svgDocument(blocks: readonly string[], height: number): string {
  return [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${WIDTH}" height="${height}" viewBox="0 0 ${WIDTH} ${height}" font-family="-apple-system, Segoe UI, Helvetica, Arial, sans-serif">`,
    '<style>.title{font-size:15px;font-weight:600;fill:#24292f}.sub{font-size:12px;fill:#57606a}.label{font-size:12px;fill:#24292f}.value{font-size:11.5px;fill:#24292f}.note{font-size:11px;fill:#57606a}.target{font-size:11px;fill:#cf222e}</style>',
    `<rect width="${WIDTH}" height="${height}" fill="#ffffff"/>`,
    ...blocks,
    '</svg>',
    '',
  ].join('\n');
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const input = process.argv[2];
  if (!input) throw new Error('usage: node dist/bench/chart.js bench/results/<date>.json');
  const output = input.replace(/\.json$/, '.svg');
  const results = JSON.parse(readFileSync(input, 'utf8')) as BenchResults;
  if (results.schema !== 2) throw new Error(`${input} has results schema ${String(results.schema)}; this renderer reads schema 2`);
  writeFileSync(output, renderChart(results));
  console.log(`wrote ${output}`);
}
