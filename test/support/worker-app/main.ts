import 'reflect-metadata';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { NestFactory } from '@nestjs/core';
import { FastifyAdapter } from '@nestjs/platform-fastify';
import { IN_FLIGHT_HEADER, SERVED_HEADER } from './worker.controller.js';
import { workerAppModule } from './worker.module.js';

/**
 * A test app in a process of its own, compiled by tsc (constructor injection by type needs the
 * decorator metadata tsc emits). Env: REDIS_URL, KEY_PREFIX, PLATFORM ('express' | 'fastify'),
 * CLOCK_SKEW_MS (shifts Date.now() of this process), TIMEOUT_MS (the module's timeoutMs, default 2,000). Prints one JSON line `{ "url": ... }` when it listens.
 */
const wallClock = Date.now;
const skew = Number(process.env.CLOCK_SKEW_MS ?? 0);
if (skew !== 0) Date.now = () => wallClock() + skew;

const redis = process.env.REDIS_URL;
const keyPrefix = process.env.KEY_PREFIX;
if (!redis || !keyPrefix) throw new Error('worker app: REDIS_URL and KEY_PREFIX are required');

const module = workerAppModule(redis, keyPrefix, Number(process.env.TIMEOUT_MS ?? 2_000));
const app =
  process.env.PLATFORM === 'fastify'
    ? await NestFactory.create(module, new FastifyAdapter(), { logger: ['error', 'warn'] })
    : await NestFactory.create(module, { logger: ['error', 'warn'] });
// When this process received each request and when it wrote the response (the real clock, in ms):
// every decision lies between the two, so the tests measure T where the decisions happen. And how many
// requests were inside this process when each arrived.
let inFlight = 0;
app.use((_request: IncomingMessage, response: ServerResponse, next: () => void) => {
  const receivedAt = wallClock();
  const seen = ++inFlight;
  let done = false;
  const leave = () => {
    if (done) return;
    done = true;
    inFlight--;
  };
  response.once('finish', leave);
  response.once('close', leave);
  const writeHead = response.writeHead;
  response.writeHead = function (this: ServerResponse, ...args: unknown[]) {
    this.setHeader(SERVED_HEADER, `${receivedAt} ${wallClock()}`);
    this.setHeader(IN_FLIGHT_HEADER, String(seen));
    return (writeHead as (...a: unknown[]) => ServerResponse).apply(this, args);
  } as typeof response.writeHead;
  next();
});
app.enableShutdownHooks();
await app.listen(0, '127.0.0.1');
process.stdout.write(`${JSON.stringify({ url: await app.getUrl(), pid: process.pid })}\n`);
