/**
 * One process of the fairness test (acquire.timing.e2e-spec.ts): a BucketService over its own Redis
 * client, built by hand from the library's sources (transpiled by the test). It says
 * `ready`, waits for `go` on stdin, fires its acquires at once, and prints one JSON line: each call's go
 * time (ms since the epoch, sub-ms), the wait Redis announced and how long the call took, and the
 * largest event-loop delay it saw.
 */
import 'reflect-metadata';
import { monitorEventLoopDelay, performance } from 'node:perf_hooks';
import { createInterface } from 'node:readline';
import { Redis } from 'ioredis';
import { BucketService } from '../../../libs/rate-limit/src/bucket/bucket.service.js';
import { resolveOptions } from '../../../libs/rate-limit/src/rate-limit.options-resolver.js';
import { RedisBucketStore } from '../../../libs/rate-limit/src/stores/redis/redis-bucket.store.js';

const [url, name, count, capacity, refill] = process.argv.slice(2);
const client = new Redis(url, { enableOfflineQueue: false, lazyConnect: true });
await client.connect();
const buckets = new BucketService(new RedisBucketStore(client, false), resolveOptions({ redis: client }));
const policy = { capacity: Number(capacity), refillPerSecond: Number(refill) };
// Load the script into this connection's path once (EVALSHA, NOSCRIPT, EVAL) before the measure.
await buckets.peek(`${name}:warm`, policy);
const lines = createInterface({ input: process.stdin });
process.stdout.write('ready\n');
for await (const line of lines) if (line === 'go') break;
const delay = monitorEventLoopDelay({ resolution: 5 });
delay.enable();
const calls = await Promise.all(
  Array.from({ length: Number(count) }, async () => {
    const decision = await buckets.acquire(name, policy);
    return { go: performance.timeOrigin + performance.now(), waitedMs: decision.waitedMs, scheduledWaitMs: decision.scheduledWaitMs };
  }),
);
delay.disable();
process.stdout.write(`${JSON.stringify({ calls, loopDelayMs: delay.max / 1e6 })}\n`);
lines.close();
await client.quit();
