import { performance } from 'node:perf_hooks';
import { openLimiter } from './limiters.js';
import { LIMITERS, LIMITS, type LimiterName, REDIS_URL } from './settings.js';

/**
 * Decisions per second of one limiter from one process: `node decisions-worker.js <limiter> <prefix>`,
 * driven over IPC by run.js. Each `run` message keeps `inFlight` calls going over `keys` keys (a limit
 * nobody reaches) for a warm-up and then for the measured time; `memory` leaves `count` idle buckets.
 */

export type WorkerMessage =
  | { cmd: 'run'; inFlight: number; keys: number; warmupMs: number; durationMs: number }
  | { cmd: 'memory'; count: number }
  | { cmd: 'exit' };

export interface RunReply {
  decisions: number;
  allowed: number;
  errors: number;
  seconds: number;
  /** When the measured part began and ended (this process's `performance` clock, as epoch ms). */
  startedAt: number;
  endedAt: number;
}

async function main(): Promise<void> {
  const [name, prefix] = process.argv.slice(2) as [LimiterName, string];
  if (!LIMITERS.includes(name) || !prefix || !process.send) throw new Error('decisions-worker.js is started by run.js');
  const limiter = await openLimiter(name, REDIS_URL, prefix, LIMITS.allowed);
  const memoryLimiter = await openLimiter(name, REDIS_URL, `${prefix}idle:`, LIMITS.memory);
  const send = (message: unknown) => process.send!(message);

  const load = async (inFlight: number, keys: number, until: number, tally: RunReply) => {
    let next = 0;
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

  process.on('message', (message: WorkerMessage) => {
    void (async () => {
      if (message.cmd === 'exit') {
        await limiter.close();
        await memoryLimiter.close();
        process.exit(0);
      }
      if (message.cmd === 'memory') {
        for (let i = 0; i < message.count; i += 100) {
          await Promise.all(
            Array.from({ length: Math.min(100, message.count - i) }, (_, j) => memoryLimiter.consume(`idle${i + j}`)),
          );
        }
        send({ done: true });
        return;
      }
      const warm: RunReply = { decisions: 0, allowed: 0, errors: 0, seconds: 0, startedAt: 0, endedAt: 0 };
      await load(message.inFlight, message.keys, performance.now() + message.warmupMs, warm);
      send({ measuring: true });
      const tally: RunReply = { decisions: 0, allowed: 0, errors: 0, seconds: 0, startedAt: 0, endedAt: 0 };
      const start = performance.now();
      tally.startedAt = performance.timeOrigin + start;
      await load(message.inFlight, message.keys, start + message.durationMs, tally);
      const end = performance.now();
      tally.endedAt = performance.timeOrigin + end;
      tally.seconds = (end - start) / 1000;
      send(tally);
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
