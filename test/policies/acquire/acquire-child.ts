/**
 * One process of the fairness test (acquire.timing.e2e-spec.ts): a BucketService over its own Redis
 * client, built by hand from the library's sources (transpiled by the test). It says `ready`, waits for
 * `go` on stdin, fires its acquires at once, and prints one JSON line: each call's go time (ms since the
 * epoch by this process's clock, sub-ms), its turn by Redis' clock (`turnAt`), the wait Redis announced
 * and how long the call took; this clock's offset to Redis' (Redis TIME = local + offsetMs, within
 * ±offsetErrorMs), and the event-loop delay that may have made each call late (`loopMs`,
 * test/support/loop-delay.ts).
 *
 * LATE_MS in the environment delays every go by that much: how the test's lateness check is shown to fail.
 */
import 'reflect-metadata';
import { performance } from 'node:perf_hooks';
import { createInterface } from 'node:readline';
import { Redis } from 'ioredis';
import { BucketService } from '../../../libs/rate-limit/src/bucket/bucket.service.js';
import { resolveOptions } from '../../../libs/rate-limit/src/rate-limit.options-resolver.js';
import { RedisBucketStore } from '../../../libs/rate-limit/src/stores/redis/redis-bucket.store.js';
import { watchLoopDelay } from '../../support/loop-delay.js';

const [url, name, count, capacity, refill] = process.argv.slice(2);
const lateMs = Number(process.env.LATE_MS ?? 0);
const client = new Redis(url, { enableOfflineQueue: false, lazyConnect: true });
await client.connect();
const buckets = new BucketService(new RedisBucketStore(client, false), resolveOptions({ redis: client }));
const policy = { capacity: Number(capacity), refillPerSecond: Number(refill) };
const clock = () => performance.timeOrigin + performance.now();

/**
 * Redis' clock less this one, from the TIME round trip that took least of `n`: Redis read its clock
 * between the send and the reply, so the offset is within half that round trip of its midpoint.
 */
async function offsetToRedis(n: number): Promise<{ offsetMs: number; offsetErrorMs: number }> {
  let best = { offsetMs: 0, offsetErrorMs: Infinity };
  for (let i = 0; i < n; i++) {
    const sent = clock();
    const [seconds, micros] = await client.time();
    const received = clock();
    const redisMs = Number(seconds) * 1000 + Number(micros) / 1000;
    if ((received - sent) / 2 < best.offsetErrorMs)
      best = { offsetMs: redisMs - (sent + received) / 2, offsetErrorMs: (received - sent) / 2 };
  }
  return best;
}

// Load the script into this connection's path once (EVALSHA, NOSCRIPT, EVAL) before the measure.
await buckets.peek(`${name}:warm`, policy);
const before = await offsetToRedis(5);
const lines = createInterface({ input: process.stdin });
process.stdout.write('ready\n');
for await (const line of lines) if (line === 'go') break;
const loop = watchLoopDelay();
const watched = performance.now();
const calls = await Promise.all(
  Array.from({ length: Number(count) }, async () => {
    const decision = await buckets.acquire(name, policy);
    if (lateMs > 0) await new Promise((resolve) => setTimeout(resolve, lateMs));
    const go = performance.now();
    // The loop delay that could have made it late: go = decision + wait + (the reply's delay) + (the
    // timer's), both at most the lateness: stalls just after Redis' decision (on this clock, 1 ms early
    // for the script's whole ms) and just before the go.
    const decided = Math.max(decision.turnAt! - decision.scheduledWaitMs - before.offsetMs - performance.timeOrigin - 1, watched);
    const late = go - decided - decision.scheduledWaitMs;
    const loopMs =
      decision.scheduledWaitMs <= late ? loop.over(decided, go) : loop.over(decided, decided + late) + loop.over(go - late, go);
    return {
      go: performance.timeOrigin + go,
      waitedMs: decision.waitedMs,
      scheduledWaitMs: decision.scheduledWaitMs,
      turnAt: decision.turnAt,
      loopMs,
    };
  }),
);
loop.stop();
// The offset measured after the run too: the better of the two (clocks do not drift apart in 2 s).
const after = await offsetToRedis(5);
const offset = after.offsetErrorMs < before.offsetErrorMs ? after : before;
process.stdout.write(`${JSON.stringify({ calls, ...offset })}\n`);
lines.close();
await client.quit();
