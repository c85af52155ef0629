import { performance } from 'node:perf_hooks';
import { openLimiter } from './limiters.js';
import { benchRedisUrl, LIMITERS, LIMITS, type LimiterName } from './settings.js';
import { quantile } from './stats.js';

/**
 * Decisions per second of one limiter from one process: `node decisions-worker.js <limiter> <prefix>`,
 * driven over IPC by run.js. Each `run` message keeps `inFlight` calls going over `keys` keys (a limit
 * nobody reaches) for a warm-up, says `warm`, and on `go` (sent once run.js has read Redis' counters)
 * for the measured time, then replies with the tally; `latency` makes one call at a time
 * and reports the p50 / p99 of a lone decision; `memory` leaves `count` idle buckets.
 */

export type WorkerMessage =
  | { cmd: 'run'; inFlight: number; keys: number; warmupMs: number; durationMs: number }
  | { cmd: 'go' }
  | { cmd: 'latency'; keys: number; durationMs: number }
  | { cmd: 'memory'; count: number }
  | { cmd: 'exit' };

export interface RunReply {
  decisions: number;
  allowed: number;
  errors: number;
  seconds: number;
}

export interface LatencyReply {
  calls: number;
  p50Us: number;
  p99Us: number;
}

async function main(): Promise<void> {
  const [name, prefix] = process.argv.slice(2) as [LimiterName, string];
  if (!LIMITERS.includes(name) || !prefix || !process.send) throw new Error('decisions-worker.js is started by run.js');
  const limiter = await openLimiter(name, benchRedisUrl(), prefix, LIMITS.allowed);
  const memoryLimiter = await openLimiter(name, benchRedisUrl(), `${prefix}idle:`, LIMITS.memory);
  const send = (message: unknown) => process.send!(message);
  let next = 0;
  let go: (() => void) | undefined;

  const load = async (inFlight: number, keys: number, until: number, tally: RunReply) => {
    const lane = async () => {
      while (performance.now() < until) {
        const key = `k${next++ % keys}`;
        try {
          if (await limiter.consume(key)) tally.allowed++;
          tally.decisions++;
        } catch {
          tally.errors++;
        }
      }
    };
    await Promise.all(Array.from({ length: inFlight }, lane));
  };

  const latency = async (keys: number, durationMs: number): Promise<LatencyReply> => {
    const samples: number[] = [];
    const until = performance.now() + durationMs;
    while (performance.now() < until) {
      const key = `k${next++ % keys}`;
      const t0 = performance.now();
      await limiter.consume(key);
      samples.push((performance.now() - t0) * 1000);
    }
    return { calls: samples.length, p50Us: quantile(samples, 0.5), p99Us: quantile(samples, 0.99) };
  };

  process.on('message', (message: WorkerMessage) => {
    void (async () => {
      switch (message.cmd) {
        case 'exit':
          await limiter.close();
          await memoryLimiter.close();
          process.exit(0);
          break;
        case 'memory':
          for (let i = 0; i < message.count; i += 100) {
            await Promise.all(Array.from({ length: Math.min(100, message.count - i) }, (_, j) => memoryLimiter.consume(`idle${i + j}`)));
          }
          send({ done: true });
          break;
        case 'go':
          go?.();
          break;
        case 'latency':
          send(await latency(message.keys, message.durationMs));
          break;
        case 'run': {
          const empty = (): RunReply => ({ decisions: 0, allowed: 0, errors: 0, seconds: 0 });
          await load(message.inFlight, message.keys, performance.now() + message.warmupMs, empty());
          const started = new Promise<void>((done) => (go = done));
          send({ warm: true });
          await started;
          const tally = empty();
          const start = performance.now();
          await load(message.inFlight, message.keys, start + message.durationMs, tally);
          tally.seconds = (performance.now() - start) / 1000;
          send(tally);
          break;
        }
      }
    })().catch((error: unknown) => {
      console.error(error);
      process.exit(1);
    });
  });
  send({ ready: true });
}

main().catch((error: unknown) => {
  console.error(error);
  process.exit(1);
});
