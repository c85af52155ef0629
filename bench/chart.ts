import { readFileSync, writeFileSync } from 'node:fs';
import { pathToFileURL } from 'node:url';
import type { BenchResults } from './results.js';
import { HTTP_PATHS, type LimiterName } from './settings.js';

/**
 * Renders the results JSON as one SVG: HTTP throughput relative to no limiter, decisions per second,
 * and what each limiter let through in its busiest second. Plain SVG text, no dependencies.
 * `node dist/bench/chart.js bench/results/<date>.json` re-renders a saved run.
 */

const WIDTH = 1000;
const LABEL_WIDTH = 250;
const BAR_AREA = 360;
const ROW = 22;
const COLORS = { ours: '#1f6feb', other: '#8c959f', none: '#d0d7de', bad: '#cf222e', floor: '#6e7781' };

/** Short names: the chart's label column is narrow; the markdown table has the full ones. */
const SHORT: Record<string, string> = {
  none: 'no limiter',
  ours: 'ours',
  'ours-no-deny-cache': 'ours, denyCache: false',
  'nestjs-throttler': '@nestjs/throttler (redis)',
  'rate-limiter-flexible': 'rate-limiter-flexible',
  evalsha: 'bare EVALSHA (floor)',
};

interface Row {
  label: string;
  value: number;
  text: string;
  color: string;
  /** A short tick drawn at this value (a bound or a target). */
  mark?: number;
}

function escape(text: string): string {
  return text.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');
}

function colorOf(name: string): string {
  if (name === 'ours') return COLORS.ours;
  if (name === 'ours-no-deny-cache') return '#54aeff';
  if (name === 'none') return COLORS.none;
  if (name === 'evalsha') return COLORS.floor;
  return COLORS.other;
}

/** A titled block of horizontal bars, values in a column on the right; returns the SVG and its height. */
function panel(
  y: number,
  title: string,
  subtitle: string,
  rows: Row[],
  scaleMax: number,
  lines: { at: number; label: string; anchor?: 'start' | 'end' }[] = [],
): { svg: string; height: number } {
  const parts: string[] = [];
  parts.push(`<text x="20" y="${y + 18}" class="title">${escape(title)}</text>`);
  parts.push(`<text x="20" y="${y + 36}" class="sub">${escape(subtitle)}</text>`);
  const top = y + 50 + (lines.length > 0 ? 14 : 0);
  const x0 = 20 + LABEL_WIDTH;
  const scale = (v: number) => (Math.min(Math.max(0, v), scaleMax) / scaleMax) * BAR_AREA;
  rows.forEach((row, i) => {
    const ry = top + i * ROW;
    if (row.label === '') return;
    parts.push(`<text x="${x0 - 8}" y="${ry + 14}" class="label" text-anchor="end">${escape(row.label)}</text>`);
    parts.push(`<rect x="${x0}" y="${ry + 3}" width="${scale(row.value).toFixed(1)}" height="${ROW - 7}" fill="${row.color}" rx="2"/>`);
    parts.push(`<text x="${x0 + BAR_AREA + 12}" y="${ry + 14}" class="value">${escape(row.text)}</text>`);
    if (row.mark !== undefined) {
      const mx = (x0 + scale(row.mark)).toFixed(1);
      parts.push(`<line x1="${mx}" x2="${mx}" y1="${ry + 1}" y2="${ry + ROW - 2}" stroke="#24292f" stroke-width="2"/>`);
    }
  });
  const bottom = top + rows.length * ROW;
  for (const line of lines) {
    const lx = (x0 + scale(line.at)).toFixed(1);
    parts.push(`<line x1="${lx}" x2="${lx}" y1="${top - 2}" y2="${bottom}" stroke="#24292f" stroke-dasharray="4 3" stroke-width="1"/>`);
    const dx = line.anchor === 'end' ? -3 : line.anchor === 'start' ? 3 : 0;
    parts.push(`<text x="${(Number(lx) + dx).toFixed(1)}" y="${top - 5}" class="note" text-anchor="${line.anchor ?? 'middle'}">${escape(line.label)}</text>`);
  }
  return { svg: parts.join('\n'), height: bottom - y + 8 };
}

const fmt = (n: number, digits = 0) =>
  Number.isFinite(n) ? n.toLocaleString('en-US', { minimumFractionDigits: digits, maximumFractionDigits: digits }) : 'n/a';

export function renderChart(results: BenchResults): string {
  const blocks: string[] = [];
  let y = 10;
  const add = (block: { svg: string; height: number }) => {
    blocks.push(block.svg);
    y += block.height + 14;
  };

  const targetOf = { allowed: 0.9, denied: 0.95 } as const;
  for (const path of Object.keys(HTTP_PATHS) as (keyof typeof HTTP_PATHS)[]) {
    const summary = results.http.summary[path] ?? {};
    const rows: Row[] = [];
    for (const variant of HTTP_PATHS[path]) {
      const s = summary[variant];
      if (!s) continue;
      rows.push({
        label: SHORT[variant],
        value: s.ratio,
        text: `${fmt(s.ratio, 2)}  ·  ${fmt(s.requestsPerSecond)} req/s  ·  p50 ${fmt(s.p50Ms)} ms, p99 ${fmt(s.p99Ms)} ms`,
        color: colorOf(variant),
      });
    }
    if (rows.length === 0) continue;
    add(
      panel(
        y,
        `HTTP ${path} path: throughput relative to no limiter (median of per-round ratios; higher is better)`,
        path === 'allowed'
          ? `a limit nobody reaches; Nest 12 + Express, autocannon ${results.settings.connections} connections, ${results.settings.httpRounds} interleaved rounds of ${results.settings.httpSeconds} s`
          : `a limit of ${results.limits.denied?.capacity ?? 10}/s that the load exceeds several hundred times over; same app and load`,
        rows,
        1.2,
        [
          { at: targetOf[path], label: `target ${targetOf[path].toFixed(2)}`, anchor: 'end' },
          { at: 1, label: '1.00', anchor: 'start' },
        ],
      ),
    );
  }

  const limiters = Object.keys(results.decisions.summary) as LimiterName[];
  const maxRate = Math.max(...limiters.map((l) => results.decisions.summary[l]!.decisionsPerSecond));
  if (limiters.length > 0) add(
    panel(
      y,
      'Decisions per second from one process (median; higher is better)',
      `${results.settings.inFlight} calls in flight over ${fmt(results.settings.decisionKeys)} keys; ratio to bare EVALSHA of our script; Redis CPU per decision in brackets`,
      limiters.map((l) => {
        const s = results.decisions.summary[l]!;
        return {
          label: SHORT[l],
          value: s.decisionsPerSecond,
          text: `${fmt(s.decisionsPerSecond)}/s · ${fmt(s.ratioToFloor, 2)} of the floor [${fmt(s.redisCpuUsPerDecision, 1)} µs]`,
          color: colorOf(l),
        };
      }),
      maxRate * 1.05,
    ),
  );

  const promiseRows: Row[] = [];
  for (const [name, p] of Object.entries(results.promise) as [LimiterName, NonNullable<BenchResults['promise'][LimiterName]>][]) {
    promiseRows.push({
      label: `${SHORT[name]}: saturated`,
      value: p.saturation.maxIn1s,
      text: `${p.saturation.maxIn1s} in 1 s (bound ${p.saturation.boundIn1s})`,
      color: p.saturation.maxIn1s > p.saturation.boundIn1s ? COLORS.bad : colorOf(name),
      mark: p.saturation.boundIn1s,
    });
    promiseRows.push({
      label: 'at a window boundary',
      value: p.boundary.maxIn1s,
      text: `${p.boundary.maxIn1s} in 1 s, ${p.boundary.maxIn200ms} in 200 ms ${p.kept ? '✓ kept' : '✗ broken'}`,
      color: p.boundary.maxIn1s > p.boundary.boundIn1s ? COLORS.bad : colorOf(name),
      mark: p.boundary.boundIn1s,
    });
  }
  const promiseMax = Math.max(1, ...promiseRows.map((r) => Math.max(r.value, r.mark ?? 0)));
  if (promiseRows.length > 0) add(
    panel(
      y,
      'Promise kept: most allowed in any 1 s on one key (4 processes × 32 in flight; tick = the stated bound)',
      'token bucket 100/s burst 100 (bound 200 in any 1 s); fixed windows 100 per 1 s window (stated: 100/s)',
      promiseRows,
      promiseMax * 1.05,
    ),
  );

  const m = results.machine;
  const footer = `${results.date} · ${m.cpu}, ${m.cores} cores, ${m.memoryGb} GB · ${m.os} · Node ${m.node} · Redis ${m.redis} · app, Redis and load generator on the same machine`;
  blocks.push(`<text x="20" y="${y + 4}" class="note">${escape(footer)}</text>`);
  const height = y + 16;
  return [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${WIDTH}" height="${height}" viewBox="0 0 ${WIDTH} ${height}" font-family="-apple-system, Segoe UI, Helvetica, Arial, sans-serif">`,
    '<style>.title{font-size:15px;font-weight:600;fill:#24292f}.sub{font-size:12px;fill:#57606a}.label{font-size:12px;fill:#24292f}.value{font-size:11.5px;fill:#24292f}.note{font-size:11px;fill:#57606a}</style>',
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
  writeFileSync(output, renderChart(JSON.parse(readFileSync(input, 'utf8')) as BenchResults));
  console.log(`wrote ${output}`);
}
