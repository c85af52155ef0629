import { readFileSync, writeFileSync } from 'node:fs';
import { basename } from 'node:path';
import { pathToFileURL } from 'node:url';
import type { BenchResults } from './results.js';
import { HTTP_PATHS, LABELS, type LimiterName } from './settings.js';

/**
 * Renders the results JSON as markdown: tables, targets, machine and method.
 * `node dist/bench/report.js bench/results/<date>.json` re-renders a saved run.
 */

const fmt = (n: number, digits = 0) =>
  Number.isFinite(n) ? n.toLocaleString('en-US', { minimumFractionDigits: digits, maximumFractionDigits: digits }) : 'n/a';

export function renderReport(results: BenchResults, chartFile: string): string {
  const lines: string[] = [];
  const m = results.machine;
  lines.push(`# Benchmark run of ${results.date}`, '');
  lines.push(`![benchmark chart](${chartFile})`, '');
  lines.push(
    `Machine: ${m.cpu}, ${m.cores} cores, ${m.memoryGb} GB, ${m.os}; Node ${m.node}; Redis ${m.redis} on loopback. ` +
      `App, Redis and load generator share the machine. Load average ${m.loadAverageAtStart.join(' / ')} at the start, ` +
      `${m.loadAverageAtEnd.join(' / ')} at the end. ${m.note} The run took ${fmt(results.durationSeconds / 60, 1)} min.`,
    '',
  );

  lines.push('## HTTP overhead', '');
  lines.push('| path | variant | req/s (median) | p50 ms | p99 ms | ratio to no limiter (median) | 2xx share | app CPU µs/req | Redis CPU µs/req |');
  lines.push('|---|---|---:|---:|---:|---:|---:|---:|---:|');
  for (const path of Object.keys(HTTP_PATHS) as (keyof typeof HTTP_PATHS)[]) {
    for (const variant of HTTP_PATHS[path]) {
      const s = results.http.summary[path]?.[variant];
      if (!s) continue;
      lines.push(
        `| ${path} | ${LABELS[variant]} | ${fmt(s.requestsPerSecond)} | ${fmt(s.p50Ms, 1)} | ${fmt(s.p99Ms, 1)} | ${fmt(s.ratio, 3)} | ${fmt(s.share2xx, 3)} | ${fmt(s.appCpuUsPerRequest, 1)} | ${fmt(s.redisCpuUsPerRequest, 1)} |`,
      );
    }
  }
  lines.push('');

  lines.push('## Decisions per second, Redis cost', '');
  lines.push('| limiter | decisions/s (median) | ratio to bare EVALSHA (median) | Redis CPU µs / decision | bytes / idle bucket | keys / bucket |');
  lines.push('|---|---:|---:|---:|---:|---:|');
  for (const [name, s] of Object.entries(results.decisions.summary) as [LimiterName, NonNullable<BenchResults['decisions']['summary'][LimiterName]>][]) {
    lines.push(
      `| ${LABELS[name]} | ${fmt(s.decisionsPerSecond)} | ${fmt(s.ratioToFloor, 3)} | ${fmt(s.redisCpuUsPerDecision, 1)} | ${fmt(s.bytesPerIdleBucket)} | ${fmt(s.keysPerIdleBucket, 1)} |`,
    );
  }
  lines.push('');

  lines.push('## Promise kept', '');
  lines.push('| limiter | promise | allowed / bound (saturated) | most in any 1 s (saturated) | at a window boundary: most in 1 s / in 200 ms | kept |');
  lines.push('|---|---|---:|---:|---:|---|');
  for (const [name, p] of Object.entries(results.promise) as [LimiterName, NonNullable<BenchResults['promise'][LimiterName]>][]) {
    lines.push(
      `| ${LABELS[name]} | ${p.promise} | ${p.saturation.allowed} / ${fmt(p.saturation.bound)} in ${fmt(p.saturation.seconds, 2)} s | ` +
        `${p.saturation.maxIn1s} (bound ${p.saturation.boundIn1s}) | ${p.boundary.maxIn1s} / ${p.boundary.maxIn200ms} ` +
        `(bound ${p.boundary.boundIn1s} / ${p.boundary.boundIn200ms}) | ${p.kept ? 'yes' : 'no'} |`,
    );
  }
  lines.push('');

  lines.push('## Targets (issue 5)', '');
  lines.push('| target | goal | measured | met |', '|---|---|---|---|');
  for (const t of results.targets) lines.push(`| ${t.name} | ${t.goal} | ${t.measured} | ${t.met ? 'yes' : 'no'} |`);
  lines.push('');

  lines.push('## What each limiter does', '');
  for (const [name, text] of Object.entries(results.algorithms)) lines.push(`- **${LABELS[name as LimiterName]}**: ${text}`);
  lines.push('');
  lines.push('## Method', '');
  for (const [name, text] of Object.entries(results.method)) lines.push(`- **${name}**: ${text}`);
  lines.push('');
  lines.push(
    `Settings: ${Object.entries(results.settings)
      .map(([k, v]) => `${k}=${v}`)
      .join(', ')}.`,
    '',
  );
  return lines.join('\n');
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const input = process.argv[2];
  if (!input) throw new Error('usage: node dist/bench/report.js bench/results/<date>.json');
  const output = input.replace(/\.json$/, '.md');
  const results = JSON.parse(readFileSync(input, 'utf8')) as BenchResults;
  writeFileSync(output, renderReport(results, basename(input).replace(/\.json$/, '.svg')));
  console.log(`wrote ${output}`);
}
