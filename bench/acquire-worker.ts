import 'reflect-metadata';
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import type { INestApplicationContext } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { Redis } from 'ioredis';
import { RateLimiterQueue, RateLimiterRedis } from 'rate-limiter-flexible';
import { BucketService, RateLimitModule } from 'nest-redis-rate-limit';
import { ACQUIRE, benchRedisUrl } from './settings.js';

/**
 * One of the processes of the acquire step: `node acquire-worker.js <waiter> <prefix> <key>`, waiter
 * `ours` (BucketService.acquire(), B = ACQUIRE.capacity, R = ACQUIRE.refillPerSecond) or
 * `rlf-queue` (rate-limiter-flexible's RateLimiterQueue over RateLimiterRedis, R points per 1 s
 * window: its duration is whole seconds). Says `ready` over IPC once warm (its script loaded), waits
 * for the start time, then keeps ACQUIRE.inFlight callers waiting for a grant, each asking again as
 * soon as it has one, until the end; replies with the epoch time (ms) of every grant and any errors.
 */

export interface AcquireReply {
  grants: number[];
  /** Commands this process sent to Redis from the start time until its last grant (ioredis sendCommand). */
  commands: number;
  errors: number;
  firstError?: string;
}

const epochNow = () => performance.timeOrigin + performance.now();

let commands = 0;

/** A client whose commands are counted in `commands` (every command goes through sendCommand). */
function countedClient(): Redis {
  const client = new Redis(benchRedisUrl());
  const send = client.sendCommand.bind(client);
  client.sendCommand = (...args: Parameters<Redis['sendCommand']>) => {
    commands++;
    return send(...args);
  };
  return client;
}

async function open(waiter: string, prefix: string): Promise<{ wait: (key: string) => Promise<unknown>; close: () => Promise<void> }> {
  const client = countedClient();
  if (waiter === 'ours') {
    const app: INestApplicationContext = await NestFactory.createApplicationContext(
      RateLimitModule.forRoot({ redis: client, keyPrefix: prefix }),
      { logger: ['error', 'warn'] },
    );
    const buckets = app.get(BucketService);
    const policy = { capacity: ACQUIRE.capacity, refillPerSecond: ACQUIRE.refillPerSecond };
    return { wait: (key) => buckets.acquire(key, policy), close: async () => (await app.close(), void (await client.quit())) };
  }
  if (waiter === 'rlf-queue') {
    const limiter = new RateLimiterRedis({
      storeClient: client,
      keyPrefix: prefix.slice(0, -1),
      points: ACQUIRE.refillPerSecond,
      duration: 1,
    });
    const queue = new RateLimiterQueue(limiter);
    return { wait: (key) => queue.removeTokens(1, key), close: async () => void (await client.quit()) };
  }
  throw new Error(`acquire-worker.js: unknown waiter "${waiter}"`);
}

async function main(): Promise<void> {
  const [waiter, prefix, key] = process.argv.slice(2);
  if (!process.send) throw new Error('acquire-worker.js is started by run.js');
  const limiter = await open(waiter, prefix);
  // Warm: connection, script loaded, JIT of the path; on a key of its own.
  for (let i = 0; i < 3; i++) await limiter.wait(`${key}:warm:${process.pid}`);
  process.once('message', (message: { goAt: number }) => {
    void (async () => {
      const reply: AcquireReply = { grants: [], commands: 0, errors: 0 };
      const until = message.goAt + ACQUIRE.seconds * 1000;
      await sleep(Math.max(0, message.goAt - epochNow()));
      commands = 0;
      const lane = async () => {
        while (epochNow() < until) {
          try {
            await limiter.wait(key);
            reply.grants.push(epochNow());
          } catch (error) {
            reply.errors++;
            reply.firstError ??= String(error);
          }
        }
      };
      await Promise.all(Array.from({ length: ACQUIRE.inFlight }, lane));
      reply.commands = commands;
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
