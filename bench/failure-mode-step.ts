import { spawn } from 'node:child_process';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import autocannon from 'autocannon';
import type { ChildProcess } from 'node:child_process';
import { fmt, HERE, progress, rotate, stopChild, track } from './processes.js';
import { freePort } from './redis.js';
import { benchRedisUrl, FAILURE_MODE, SETTINGS } from './settings.js';
import { median, round } from './stats.js';

/**
 * The failure-mode step (issue 32, item 6): what the default failureMode ('local') costs beside an
 * explicit 'open' (the previous default). Four app processes (failure-mode-app.ts): default and
 * 'open' on the run's healthy Redis, default and 'open' on a port nobody listens on (an outage from
 * start-up). Three phases, each over FAILURE_MODE.rounds rounds with the two apps interleaved (rotated
 * order), autocannon with SETTINGS.connections connections:
 * - healthy: GET /allowed (a limit nobody reaches), req/s: the default's cost on the healthy path;
 * - outage, one client: GET /limited with one API key per app and round: req/s, and what was admitted
 *   against B + R·t;
 * - outage, a new client per request: GET /limited with a new API key for every request (every request
 *   a new bucket: the in-process store's worst case), req/s, and the app's heap after a full GC
 *   against its heap before the phase. Every app counts its decisions by source (onDecision) (at most maxLocalBuckets, 100,000, buckets are kept).
 * Nothing is asserted.
 */

const VARIANTS = ['default', 'open'] as const;
type Variant = (typeof VARIANTS)[number];
type Phase = 'healthy' | 'outage-one-client' | 'outage-new-clients';
const PHASES: readonly Phase[] = ['healthy', 'outage-one-client', 'outage-new-clients'];

interface App {
  child: ChildProcess;
  url: string;
}

export interface FailureModeRun {
  round: number;
  phase: Phase;
  variant: Variant;
  requestsPerSecond: number;
  status2xx: number;
  status429: number;
  other: number;
  /** The one-client phase: B + R·t for the measured seconds (the warm-up used another key). */
  bound?: number;
  /** The new-clients phase: heap used after a full GC, MiB, after this round, less before the phase's first round. */
  heapGrowthMiB?: number;
  /** The new-clients phase: RSS after this round, MiB. */
  rssMiB?: number;
  /** The measured seconds' decisions by source (onDecision): 'store' and 'cache' are Redis' answers, 'local' and 'open' failureMode's. */
  sources: Record<string, number>;
}

export interface FailureModeResult {
  settings: typeof FAILURE_MODE & { connections: number };
  method: string;
  runs: FailureModeRun[];
  /** Per phase: the median over rounds of default req/s ÷ open req/s (each ratio inside one round). */
  ratios: Record<Phase, { median: number; min: number; max: number }>;
}

export const failureModePlannedSeconds = () =>
  PHASES.length * FAILURE_MODE.rounds * VARIANTS.length * (FAILURE_MODE.warmupSeconds + FAILURE_MODE.seconds + 0.5) + 10;

async function startApp(variant: Variant, redis: string, prefix: string): Promise<App> {
  const child = track(
    spawn(process.execPath, ['--expose-gc', join(HERE, 'failure-mode-app.js'), variant, redis, prefix], {
      stdio: ['ignore', 'pipe', 'inherit'],
    }),
  );
  const lines = createInterface({ input: child.stdout! });
  const port = await new Promise<number>((done, fail) => {
    const timer = setTimeout(() => fail(new Error(`failure-mode app (${variant}) did not start within 20 s`)), 20_000);
    child.once('exit', (code) => fail(new Error(`failure-mode app (${variant}) exited with ${code} before listening`)));
    lines.once('line', (line) => {
      clearTimeout(timer);
      done((JSON.parse(line) as { port: number }).port);
    });
  });
  return { child, url: `http://127.0.0.1:${port}` };
}

interface AppStats {
  heapUsed: number;
  rss: number;
  sources: Record<string, number>;
}

async function stats(app: App): Promise<AppStats> {
  return (await (await fetch(`${app.url}/stats`)).json()) as AppStats;
}

/** Decisions by source in `after` less those in `before`, the zeros left out. */
function sourcesBetween(before: AppStats, after: AppStats): Record<string, number> {
  return Object.fromEntries(
    Object.entries(after.sources)
      .map(([source, n]) => [source, n - (before.sources[source] ?? 0)] as const)
      .filter(([, n]) => n > 0),
  );
}

/** autocannon on `path` for `seconds`; `apiKey` gives every request's x-api-key (none when absent). */
async function load(url: string, path: string, seconds: number, apiKey?: () => string) {
  type Request = NonNullable<Parameters<typeof autocannon>[0]['requests']>[number];
  const request: Request = { method: 'GET', path };
  if (apiKey) request.setupRequest = (r) => ({ ...r, headers: { ...r.headers, 'x-api-key': apiKey() } });
  let status429 = 0;
  const instance = autocannon({ url, connections: SETTINGS.connections, duration: seconds, requests: [request] });
  instance.on('response', (_client, status) => {
    if (status === 429) status429++;
  });
  const result = await instance;
  return { result, status429 };
}

export async function failureModeStep(runPrefix: string): Promise<FailureModeResult> {
  const t0 = Date.now();
  const nobody = `redis://127.0.0.1:${await freePort()}`;
  const apps = {
    healthy: {} as Record<Variant, App>,
    outage: {} as Record<Variant, App>,
  };
  for (const variant of VARIANTS) {
    apps.healthy[variant] = await startApp(variant, benchRedisUrl(), `${runPrefix}fm-${variant}:`);
    apps.outage[variant] = await startApp(variant, nobody, `${runPrefix}fm-out-${variant}:`);
  }
  progress(
    'failure-mode',
    `started 4 apps (default and 'open', on the run's Redis and on ${nobody}, where nobody listens)`,
    Date.now() - t0,
  );
  const runs: FailureModeRun[] = [];
  const heapBefore = {} as Record<Variant, number>;
  let fresh = 0;
  const perRun = FAILURE_MODE.warmupSeconds + FAILURE_MODE.seconds + 0.5;
  try {
    for (const phase of PHASES) {
      const group = phase === 'healthy' ? apps.healthy : apps.outage;
      if (phase === 'outage-new-clients') for (const variant of VARIANTS) heapBefore[variant] = (await stats(group[variant])).heapUsed;
      for (let r = 0; r < FAILURE_MODE.rounds; r++) {
        for (const variant of rotate(VARIANTS, r)) {
          const t = Date.now();
          const app = group[variant];
          const path = phase === 'healthy' ? '/allowed' : '/limited';
          const key =
            phase === 'healthy'
              ? undefined
              : phase === 'outage-one-client'
                ? (label: string) => () => `one-${label}-${r}`
                : () => () => `new-${fresh++}`;
          if (FAILURE_MODE.warmupSeconds > 0) await load(app.url, path, FAILURE_MODE.warmupSeconds, key?.('warm-up'));
          const before = await stats(app);
          const { result, status429 } = await load(app.url, path, FAILURE_MODE.seconds, key?.('measured'));
          const after = await stats(app);
          const run: FailureModeRun = {
            round: r + 1,
            phase,
            variant,
            requestsPerSecond: result.requests.average,
            status2xx: result['2xx'],
            status429,
            other: result.non2xx - status429 + result.errors + result.timeouts,
            sources: sourcesBetween(before, after),
          };
          if (phase === 'outage-one-client') run.bound = FAILURE_MODE.capacity + FAILURE_MODE.refillPerSecond * result.duration;
          if (phase === 'outage-new-clients') {
            run.heapGrowthMiB = round((after.heapUsed - heapBefore[variant]) / 2 ** 20, 1);
            run.rssMiB = round(after.rss / 2 ** 20, 1);
          }
          runs.push(run);
          progress(
            'failure-mode',
            `round ${r + 1} ${phase} ${variant}: ${fmt(run.requestsPerSecond)} req/s, ${fmt(run.status2xx)} 2xx, ${fmt(run.status429)} 429` +
              `${run.other ? `, ${run.other} other` : ''}${run.bound === undefined ? '' : ` (B + R·t = ${round(run.bound, 1)})`}` +
              `${run.heapGrowthMiB === undefined ? '' : `; heap +${run.heapGrowthMiB} MiB, RSS ${run.rssMiB} MiB`}; by source ${JSON.stringify(run.sources)}`,
            Date.now() - t,
            perRun,
          );
        }
      }
    }
  } finally {
    await Promise.all([...Object.values(apps.healthy), ...Object.values(apps.outage)].map((app) => stopChild(app.child)));
  }
  const ratios = {} as FailureModeResult['ratios'];
  for (const phase of PHASES) {
    const perRound = Array.from({ length: FAILURE_MODE.rounds }, (_, r) => {
      const of = (variant: Variant) => runs.find((run) => run.phase === phase && run.round === r + 1 && run.variant === variant)!;
      return of('default').requestsPerSecond / of('open').requestsPerSecond;
    });
    ratios[phase] = { median: round(median(perRound), 3), min: round(Math.min(...perRound), 3), max: round(Math.max(...perRound), 3) };
  }
  return { settings: { ...FAILURE_MODE, connections: SETTINGS.connections }, method: method(), runs, ratios };
}

function method(): string {
  return (
    `Four Nest 12 Express app processes of ours (bench/failure-mode-app.ts): the module's default options (failureMode 'local') and the same ` +
    `with failureMode: 'open', each once on the run's own healthy Redis and once on a port where nobody listens (so an outage from start-up: ` +
    `refused connections, the breaker open after 3 failures). autocannon in the bench process, ${SETTINGS.connections} connections, ` +
    `${FAILURE_MODE.warmupSeconds} s warm-up then ${FAILURE_MODE.seconds} s measured per app, phase and round, ${FAILURE_MODE.rounds} rounds ` +
    `with the two apps in rotated order; ratios are default ÷ open inside one round. Healthy: GET /allowed, a limit nobody reaches, per IP. ` +
    `Outage, one client: GET /limited (${FAILURE_MODE.capacity} tokens, ${FAILURE_MODE.refillPerSecond}/s, per API key) with one key per app ` +
    `and round. Outage, new clients: GET /limited with a new API key for every request; the heap is read after a full GC (--expose-gc) ` +
    `before the phase and after each round.`
  );
}

export function renderFailureMode(result: FailureModeResult, heading: string): string {
  const lines = [`${heading} The default failureMode ('local') beside 'open'`, '', result.method, ''];
  lines.push(
    '| phase | variant | req/s per round | 2xx / 429 per round | decisions by source, all rounds | heap growth (MiB) / RSS (MiB) after each round | default ÷ open req/s, median (min–max) |',
  );
  lines.push('|---|---|---|---|---|---|---|');
  for (const phase of PHASES) {
    for (const variant of VARIANTS) {
      const mine = result.runs.filter((run) => run.phase === phase && run.variant === variant);
      const ratio = result.ratios[phase];
      lines.push(
        `| ${phase} | ${variant === 'default' ? "default ('local')" : "'open'"} | ${mine.map((run) => fmt(run.requestsPerSecond)).join(' / ')} | ` +
          `${mine.map((run) => `${fmt(run.status2xx)} / ${fmt(run.status429)}${run.bound === undefined ? '' : ` (B + R·t ${round(run.bound, 1)})`}`).join('; ')} | ` +
          `${Object.entries(
            mine.reduce<Record<string, number>>((all, run) => {
              for (const [source, n] of Object.entries(run.sources)) all[source] = (all[source] ?? 0) + n;
              return all;
            }, {}),
          )
            .map(([source, n]) => `${source} ${fmt(n)}`)
            .join(', ')} | ` +
          `${mine.some((run) => run.heapGrowthMiB !== undefined) ? mine.map((run) => `${run.heapGrowthMiB} / ${run.rssMiB}`).join('; ') : ''} | ` +
          `${variant === 'default' ? `${ratio.median} (${ratio.min}–${ratio.max})` : ''} |`,
      );
    }
  }
  return `${lines.join('\n')}\n`;
}
