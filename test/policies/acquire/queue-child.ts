/**
 * One process of the queue-bound tests (queue-bound.timing.e2e-spec.ts): a BucketService over its own
 * Redis client, built by hand from the library's sources (transpiled by the test). It says `ready`, waits
 * for `go` on stdin, then follows its plan (argv, JSON):
 * - `count` calls of acquire() at once, every `abortEvery`-th one (from the second) with a signal aborted
 *   at a random moment within `abortWithinMs`;
 * - `later` more calls `laterAfterMs` after the go;
 * - `closeAfterMs`: the application closes then (BucketService.onModuleDestroy: the waits end, their
 *   reservations given back).
 * It prints one JSON line: the turn (Redis' clock, `turnAt`) of every call that was granted, and how many
 * were aborted, ended by the close, refused for a wait beyond maxWaitMs, or refused otherwise.
 */
import 'reflect-metadata';
import { createInterface } from 'node:readline';
import { Redis } from 'ioredis';
import { BucketService } from '../../../libs/rate-limit/src/bucket/bucket.service.js';
import { resolveOptions } from '../../../libs/rate-limit/src/rate-limit.options-resolver.js';
import { RedisBucketStore } from '../../../libs/rate-limit/src/stores/redis/redis-bucket.store.js';
import type { Plan, QueueChildResult } from './queue-plan.js';

const [url, name, planText] = process.argv.slice(2);
const plan = JSON.parse(planText) as Plan;
const client = new Redis(url, { enableOfflineQueue: false, lazyConnect: true });
await client.connect();
const buckets = new BucketService(
  new RedisBucketStore(client, false),
  resolveOptions({ redis: client, failureMode: 'closed', timeoutMs: 2_000, acquire: { maxWaitMs: plan.maxWaitMs } }),
);
const policy = { capacity: plan.capacity, refillPerSecond: plan.refillPerSecond };
// Load the script into this connection's path once (EVALSHA, NOSCRIPT, EVAL) before the measure.
await buckets.peek(`${name}:warm`, policy);
const lines = createInterface({ input: process.stdin });
process.stdout.write('ready\n');
for await (const line of lines) if (line === 'go') break;

const granted: number[] = [];
const outcomes: Omit<QueueChildResult, 'granted'> = { aborted: 0, closed: 0, tooLong: 0, refused: 0 };
const call = async (signal?: AbortSignal): Promise<void> => {
  try {
    granted.push((await buckets.acquire(name, policy, { signal })).turnAt!);
  } catch (error) {
    const { name, code } = error as { name?: string; code?: unknown };
    if (name === 'AbortError') outcomes.aborted++;
    else if (code === 'ERR_RATE_LIMIT_SHUTTING_DOWN') outcomes.closed++;
    else if (code === 'ERR_RATE_LIMIT_WAIT_TOO_LONG') outcomes.tooLong++;
    else {
      outcomes.refused++;
      process.stderr.write(`queue child: ${String(error)}\n`);
    }
  }
};
const calls: Promise<void>[] = [];
for (let i = 0; i < plan.count; i++) {
  if (plan.abortEvery && i % plan.abortEvery === 1) {
    const controller = new AbortController();
    setTimeout(() => controller.abort(), Math.random() * (plan.abortWithinMs ?? 0));
    calls.push(call(controller.signal));
  } else calls.push(call());
}
if (plan.later) {
  await new Promise((resolve) => setTimeout(resolve, plan.laterAfterMs ?? 0));
  for (let i = 0; i < plan.later; i++) calls.push(call());
}
if (plan.closeAfterMs !== undefined) {
  await new Promise((resolve) => setTimeout(resolve, plan.closeAfterMs));
  await buckets.onModuleDestroy();
}
await Promise.all(calls);
process.stdout.write(`${JSON.stringify({ granted, ...outcomes })}\n`);
lines.close();
await client.quit();
