import { performance } from 'node:perf_hooks';
import { Redis } from 'ioredis';
import { benchRedisUrl, STARVED } from './settings.js';
import { quantile, round } from './stats.js';

/**
 * Redis' own latency, seen from a process of its own (forked with IPC by starved-step.ts): one PING
 * every STARVED.probeEveryMs ms on a connection of its own, whether the previous one has answered or
 * not, timed from the call to the reply. The probe is a process on the same machine, so a reply that
 * waited for the probe itself to be scheduled counts too: its own timer lag is reported beside it.
 * `reset` starts a window; `stats` answers the window's figures (and starts the next).
 */

export interface ProbeStats {
  /** PINGs sent in the window that answered. */
  probes: number;
  errors: number;
  /** PINGs still unanswered when the window closed (in the max and the counts over 50 / 100 ms, at their age then). */
  pending: number;
  p50Ms: number;
  p99Ms: number;
  maxMs: number;
  /** Replies later than the library's default timeoutMs (100 ms) and than half of it. */
  over100Ms: number;
  over50Ms: number;
  /** How late the probe's own 10 ms timer fired (its own share of the CPU), ms. */
  lagP99Ms: number;
  lagMaxMs: number;
}

/** The stats reply: the figures, and every PING of the window as [sent, answered] epoch ms (answered: the window's end if it had not). */
export interface ProbeReply {
  stats: ProbeStats;
  pings: [number, number][];
}

async function main(): Promise<void> {
  if (!process.send) throw new Error('starved-probe.js is started by the bench (starved-step.ts)');
  const redis = new Redis(benchRedisUrl(), { maxRetriesPerRequest: 1 });
  redis.on('error', () => undefined);
  await redis.ping();
  const period = STARVED.probeEveryMs;
  let latencies: number[] = [];
  let pings: [number, number][] = [];
  const epoch = (at: number) => performance.timeOrigin + at;
  let lags: number[] = [];
  let errors = 0;
  let window = 0;
  const inFlight = new Map<number, number>();
  let next = 0;
  let last = performance.now();

  const timer = setInterval(() => {
    const sentAt = performance.now();
    lags.push(Math.max(0, sentAt - last - period));
    last = sentAt;
    const id = next++;
    const inWindow = window;
    inFlight.set(id, sentAt);
    redis.ping().then(
      () => {
        inFlight.delete(id);
        if (inWindow !== window) return;
        const answeredAt = performance.now();
        latencies.push(answeredAt - sentAt);
        pings.push([epoch(sentAt), epoch(answeredAt)]);
      },
      () => {
        inFlight.delete(id);
        if (inWindow === window) errors++;
      },
    );
  }, period);

  process.on('message', (message: { type: 'reset' | 'stats' }) => {
    const now = performance.now();
    if (message.type === 'stats') {
      // Unanswered ones are at least this late: they count toward the max and the counts over 50 / 100 ms,
      // not toward the quantiles (a PING sent just before the window closed would pull them down).
      const late = [...inFlight.values()].map((sentAt) => now - sentAt);
      const all = [...latencies, ...late];
      const stats: ProbeStats = {
        probes: latencies.length,
        errors,
        pending: late.length,
        p50Ms: round(quantile(latencies, 0.5), 2),
        p99Ms: round(quantile(latencies, 0.99), 2),
        maxMs: round(all.length ? Math.max(...all) : Number.NaN, 2),
        over100Ms: all.filter((ms) => ms > STARVED.defaultTimeoutMs).length,
        over50Ms: all.filter((ms) => ms > STARVED.defaultTimeoutMs / 2).length,
        lagP99Ms: round(quantile(lags, 0.99), 2),
        lagMaxMs: round(lags.length ? Math.max(...lags) : Number.NaN, 2),
      };
      for (const sentAt of inFlight.values()) pings.push([epoch(sentAt), epoch(now)]);
      const reply: ProbeReply = { stats, pings };
      process.send!({ type: 'stats', ...reply });
    } else {
      process.send!({ type: 'reset' });
    }
    window++;
    latencies = [];
    pings = [];
    lags = [];
    errors = 0;
    inFlight.clear();
  });
  process.once('disconnect', () => {
    clearInterval(timer);
    redis.disconnect();
    process.exit(0);
  });
  process.send({ type: 'ready' });
}

main().catch((error: unknown) => {
  console.error(error);
  process.exit(1);
});
