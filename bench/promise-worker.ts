import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import { openLimiter } from './limiters.js';
import { benchRedisUrl, LIMITERS, LIMITS, type LimiterName, PROBE_LENGTH_MS, PROBE_OPEN_MS } from './settings.js';

/**
 * One of the processes that hammer one key: `node promise-worker.js <limiter> <prefix> <key> <index>
 * <inFlight> <seconds>`. Says `ready` over IPC, waits for the start time run.js sends, then:
 * 1. saturation: `inFlight` calls at a time on `key` for `seconds`;
 * 2. boundary probe on a fresh key: process 0 sends one request at `probeAt` (that opens a fixed
 *    window), then every process saturates from `probeAt + 900 ms` for one second, across the end of
 *    that window.
 * Replies with the epoch times (ms, fractional) at which allowed replies arrived, per phase.
 */

export interface PromiseReply {
  saturation: { allowed: number[]; denied: number; errors: number; firstSentAt: number; lastReplyAt: number };
  boundary: { allowed: number[]; denied: number; errors: number };
}

const epochNow = () => performance.timeOrigin + performance.now();

async function sleepUntil(epochMs: number): Promise<void> {
  const wait = epochMs - epochNow();
  if (wait > 0) await sleep(wait);
}

async function main(): Promise<void> {
  const [name, prefix, key, index, inFlight, seconds] = process.argv.slice(2);
  if (!LIMITERS.includes(name as LimiterName) || !process.send) throw new Error('promise-worker.js is started by run.js');
  const limiter = await openLimiter(name as LimiterName, benchRedisUrl(), prefix, LIMITS.promise);

  const hammer = async (target: string, until: number, tally: { allowed: number[]; denied: number; errors: number }) => {
    const lane = async () => {
      while (epochNow() < until) {
        try {
          if (await limiter.consume(target)) tally.allowed.push(epochNow());
          else tally.denied++;
        } catch {
          tally.errors++;
        }
      }
    };
    await Promise.all(Array.from({ length: Number(inFlight) }, lane));
  };

  process.once('message', (message: { goAt: number; probeAt: number }) => {
    void (async () => {
      const reply: PromiseReply = {
        saturation: { allowed: [], denied: 0, errors: 0, firstSentAt: 0, lastReplyAt: 0 },
        boundary: { allowed: [], denied: 0, errors: 0 },
      };
      await sleepUntil(message.goAt);
      reply.saturation.firstSentAt = epochNow();
      await hammer(key, message.goAt + Number(seconds) * 1000, reply.saturation);
      reply.saturation.lastReplyAt = epochNow();

      const probeKey = `${key}:boundary`;
      await sleepUntil(message.probeAt);
      if (index === '0') {
        if (await limiter.consume(probeKey)) reply.boundary.allowed.push(epochNow());
        else reply.boundary.denied++;
      }
      await sleepUntil(message.probeAt + PROBE_OPEN_MS);
      await hammer(probeKey, message.probeAt + PROBE_OPEN_MS + PROBE_LENGTH_MS, reply.boundary);
      await limiter.close();
      process.send!(reply, () => process.exit(0));
    })().catch((error: unknown) => {
      console.error(error);
      process.exit(1);
    });
  });
  process.send({ ready: true });
}

main().catch((error: unknown) => {
  console.error(error);
  process.exit(1);
});
