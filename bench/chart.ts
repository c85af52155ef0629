import { readFileSync, writeFileSync } from 'node:fs';
import { pathToFileURL } from 'node:url';
import type { BenchResults } from './results.js';
import { HTTP_PATHS, LABELS, type LimiterName } from './settings.js';

/**
 * Renders the results JSON as one SVG: HTTP throughput relative to no limiter, decisions per second,
 * and what each limiter let through in its busiest second. Plain SVG text, no dependencies.
 * `node dist/bench/chart.js bench/results/<date>.json` re-renders a saved run.
 */

const WIDTH = 980;
const LABEL_WIDTH = 330;
const BAR_AREA = 470;
const ROW = 22;
const COLORS = { ours: '#1f6feb', other: '#8c959f', none: '#d0d7de', bad: '#cf222e', floor: '#6e7781' };

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

/** A titled block of horizontal bars; returns the SVG and its height. */
function panel(y: number, title: string, subtitle: string, rows: Row[], scaleMax: number, lines: { at: number; label: string }[] = []): { svg: string; height: number } {
  const parts: string[] = [];
  parts.push(`<text x="20" y="${y + 18}" class="title">${escape(title)}</text>`);
  parts.push(`<text x="20" y="${y + 36}" class="sub">${escape(subtitle)}</text>`);
  const top = y + 50;
  const x0 = 20 + LABEL_WIDTH;
  const scale = (v: number) => (Math.max(0, v) / scaleMax) * BAR_AREA;
  rows.forEach((row, i) => {
    const ry = top + i * ROW;
    if (row.label === '') return;
    parts.push(`<text x="${x0 - 8}" y="${ry + 14}" class="label" text-anchor="end">${escape(row.label)}</text>`);
    parts.push(`<rect x="${x0}" y="${ry + 3}" width="${scale(row.value).toFixed(1)}" height="${ROW - 7}" fill="${row.color}" rx="2"/>`);
    parts.push(`<text x="${(x0 + scale(row.value) + 6).toFixed(1)}" y="${ry + 14}" class="value">${escape(row.text)}</text>`);
    if (row.mark !== undefined) {
      const mx = (x0 + scale(row.mark)).toFixed(1);
      parts.push(`<line x1="${mx}" x2="${mx}" y1="${ry + 1}" y2="${ry + ROW - 2}" stroke="#24292f" stroke-width="2"/>`);
    }
  });
  const bottom = top + rows.length * ROW;
  for (const line of lines) {
    const lx = (x0 + scale(line.at)).toFixed(1);
    parts.push(`<line x1="${lx}" x2="${lx}" y1="${top}" y2="${bottom}" stroke="#24292f" stroke-dasharray="4 3" stroke-width="1"/>`);
    parts.push(`<text x="${lx}" y="${bottom + 12}" class="note" text-anchor="middle">${escape(line.label)}</text>`);
  }
  return { svg: parts.join('\n'), height: bottom - y + (lines.length > 0 ? 26 : 12) };
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

  const httpRows: Row[] = [];
  const paths = Object.keys(HTTP_PATHS) as (keyof typeof HTTP_PATHS)[];
  for (const path of paths) {
    const summary = results.http.summary[path] ?? {};
    for (const variant of HTTP_PATHS[path]) {
      const s = summary[variant];
      if (!s) continue;
      httpRows.push({
        label: `${path}: ${LABELS[variant]}`,
        value: s.ratio,
        text: `${fmt(s.ratio, 2)} · ${fmt(s.requestsPerSecond)} req/s · p99 ${fmt(s.p99Ms)} ms`,
        color: colorOf(variant),
      });
    }
    httpRows.push({ label: '', value: 0, text: '', color: '' });
  }
  httpRows.pop();
  add(
    panel(
      y,
      'HTTP throughput relative to no limiter (median of per-round ratios; higher is better)',
      `Nest 12 + Express, one JSON route, autocannon ${results.settings.connections} connections, ${results.settings.httpRounds} interleaved rounds of ${results.settings.httpSeconds} s`,
      httpRows,
      1.15,
      [
        { at: 0.9, label: 'target allowed 0.90' },
        { at: 0.95, label: 'denied 0.95' },
        { at: 1, label: '1.00' },
      ],
    ),
  );

  const limiters = Object.keys(results.decisions.summary) as LimiterName[];
  const maxRate = Math.max(...limiters.map((l) => results.decisions.summary[l]!.decisionsPerSecond));
  add(
    panel(
      y,
      'Decisions per second from one process (median; higher is better)',
      `${results.settings.inFlight} calls in flight over ${fmt(results.settings.decisionKeys)} keys; Redis CPU per decision in brackets`,
      limiters.map((l) => {
        const s = results.decisions.summary[l]!;
        return {
          label: LABELS[l],
          value: s.decisionsPerSecond,
          text: `${fmt(s.decisionsPerSecond)}/s · ${fmt(s.ratioToFloor, 2)} of floor [${fmt(s.redisCpuUsPerDecision, 1)} µs]`,
          color: colorOf(l),
        };
      }),
      maxRate * 1.45,
    ),
  );

  const promiseRows: Row[] = [];
  for (const [name, p] of Object.entries(results.promise) as [LimiterName, NonNullable<BenchResults['promise'][LimiterName]>][]) {
    promiseRows.push({
      label: `${LABELS[name]}: saturated`,
      value: p.saturation.maxIn1s,
      text: `${p.saturation.maxIn1s} in 1 s (bound ${p.saturation.boundIn1s})`,
      color: p.saturation.maxIn1s > p.saturation.boundIn1s ? COLORS.bad : colorOf(name),
      mark: p.saturation.boundIn1s,
    });
    promiseRows.push({
      label: `at a window boundary`,
      value: p.boundary.maxIn1s,
      text: `${p.boundary.maxIn1s} in 1 s, ${p.boundary.maxIn200ms} in 200 ms ${p.kept ? '✓ kept' : '✗ broken'}`,
      color: p.boundary.maxIn1s > p.boundary.boundIn1s ? COLORS.bad : colorOf(name),
      mark: p.boundary.boundIn1s,
    });
  }
  const promiseMax = Math.max(1, ...promiseRows.map((r) => Math.max(r.value, r.mark ?? 0)));
  add(
    panel(
      y,
      'Promise kept: most allowed in any 1 s on one key (4 processes × 32 in flight; tick = the stated bound)',
      'token bucket 100/s burst 100 (bound 200 in any 1 s); fixed windows 100 per 1 s window (stated: 100/s)',
      promiseRows,
      promiseMax * 1.6,
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
