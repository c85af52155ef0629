import { Redis } from 'ioredis';
import type { Platform } from '../../support/app.js';
import { buildWorkerApp, LoadDriver, startWorkers, stopAll, type Worker, type WorkerBuild } from '../../support/processes.js';
import { deleteKeys, redisUrl, testPrefix, tokensOf } from '../../support/redis.js';
import { B, HOURLY, R } from '../../support/worker-app/worker.controller.js';

/**
 * The promise "no more than R per second with burst B, across any number of instances", measured:
 * four separate Node processes (two on Express, two on Fastify), each a Nest app with the module
 * defaults, drive one bucket in the shared Redis with 32 requests in flight each for 4 s.
 * Allowed must be at most B + R·T + 1 and at least that minus R·0.25 s, T running from the first
 * request received to the last response written (stamped by the workers).
 */
const PROCESSES: Platform[] = ['express', 'fastify', 'express', 'fastify'];
const IN_FLIGHT_PER_PROCESS = 32;
const DURATION_MS = 4_000;
const SHARED_KEY = { 'x-api-key': 'shared-by-all-processes' };

describe('four processes (2 Express, 2 Fastify) share one bucket exactly', () => {
  const prefix = testPrefix('multi-process');
  let client: Redis;
  let build: WorkerBuild | undefined;
  let workers: Worker[] = [];
  let driver: LoadDriver;

  beforeAll(async () => {
    const url = await redisUrl();
    client = new Redis(url);
    build = await buildWorkerApp();
    const entry = build.entry;
    // If one fails to start, the others are stopped before this rejects.
    workers = await startWorkers(
      entry,
      PROCESSES.map((platform) => ({ redisUrl: url, keyPrefix: prefix, platform })),
    );
    driver = new LoadDriver(
      workers.map((w) => w.url),
      IN_FLIGHT_PER_PROCESS,
    );
    // Open every keep-alive connection and run the limited path once per process (the first script
    // call on a connection sends the body), on buckets of their own.
    await driver.drive('/ping', {}, 300);
    await driver.drive('/single', { 'x-api-key': 'warm-up' }, 300);
  }, 90_000);

  afterAll(async () => {
    driver?.close();
    try {
      await stopAll(workers);
    } finally {
      await build?.remove();
      await deleteKeys(client, prefix);
      await client.quit();
    }
  }, 30_000);

  it('runs every worker in a process of its own', () => {
    const pids = new Set(workers.map((w) => w.pid));
    expect(pids.size).toBe(PROCESSES.length);
    expect(pids.has(process.pid)).toBe(false);
  });

  async function driveAndCheck(path: string) {
    const { seconds, servedSeconds, perUrl } = await driver.drive(path, SHARED_KEY, DURATION_MS);
    const allowed = perUrl.reduce((n, s) => n + s.allowed, 0);
    const denied = perUrl.reduce((n, s) => n + s.denied, 0);
    // T: from the first request a worker received to the last response a worker wrote. Every
    // decision lies in it; the test process's own delays (it drives 128 connections) do not.
    const T = servedSeconds;
    const promise = B + R * T + 1;
    console.log(
      `${path}: ${allowed} allowed of ${allowed + denied} requests; T = ${T.toFixed(3)} s ` +
        `(${seconds.toFixed(3)} s seen by the test); B + R·T + 1 = ${promise.toFixed(1)}, ` +
        `short by ${(promise - allowed).toFixed(1)}; allowed per process ${perUrl.map((s) => s.allowed).join('/')}; ` +
        `most requests inside a process at once ${perUrl.map((s) => s.maxInFlightAtWorker).join('/')}`,
    );
    for (const stats of perUrl) {
      expect(stats.failed).toEqual([]);
      // An admission without a Redis decision (a timeout under failureMode 'open') would break the promise.
      expect(stats.allowedWithoutDecision).toBe(0);
      // The decisions really were concurrent inside each worker (counted there, not by the driver): at
      // least a quarter of the driver's connections at once, and never more than it opened.
      expect(stats.maxInFlightAtWorker).toBeGreaterThanOrEqual(IN_FLIGHT_PER_PROCESS / 4);
      expect(stats.maxInFlightAtWorker).toBeLessThanOrEqual(IN_FLIGHT_PER_PROCESS);
      // Every process got a share of the one bucket and was refused the rest.
      expect(stats.allowed).toBeGreaterThan(0);
      expect(stats.denied).toBeGreaterThan(0);
    }
    expect(T).toBeGreaterThanOrEqual(3);
    expect(T).toBeLessThanOrEqual(seconds + 0.01);
    expect(allowed).toBeLessThanOrEqual(promise);
    expect(allowed).toBeGreaterThanOrEqual(promise - R * 0.25);
    return { allowed, seconds: T };
  }

  it(`admits at most B + R·T + 1 (B = ${B}, R = ${R}/s) and no more than R·0.25 s fewer on a one-policy route`, async () => {
    await driveAndCheck('/single');
  }, 30_000);

  it('admits as exactly on a two-policy route, and drains the second bucket once per admitted request only', async () => {
    const { allowed, seconds } = await driveAndCheck('/double');
    // The hourly quota (per IP) never binds here; denials by the burst policy must not touch it.
    const stored = await tokensOf(client, `${prefix}{ip:127.0.0.1}:double-hourly`);
    const taken = HOURLY.capacity - stored;
    expect(taken).toBeLessThanOrEqual(allowed);
    expect(taken).toBeGreaterThanOrEqual(allowed - HOURLY.refillPerSecond * seconds - 0.01);
  }, 30_000);
});
