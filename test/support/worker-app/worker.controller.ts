import { Controller, Get } from '@nestjs/common';
import { RateLimit, SkipRateLimit } from '../../../libs/rate-limit/src/index.js';

/** The numbers of the exactness promise under test: burst B = 100, refill R = 20 per second. */
export const B = 100;
export const R = 20;
/** A quota that never binds during a test run but must be drained exactly once per admitted request. */
export const HOURLY = { capacity: 1000, refillPerSecond: 1000 / 3600 } as const;

/** A bucket that refills one token per 100 s: what a test drains stays drained while it runs. */
export const SLOW = { capacity: 5, refillPerSecond: 0.01 } as const;

/**
 * Leased buckets (issue 35): a large one that four processes drive at once (B = 10,000, R = 5,000/s;
 * batches of at most capacity / 20), and a small one that a few processes drain within a second
 * (B = 250, R = 500/s; batches of at most 50, and a quarter of what the bucket holds).
 */
export const LEASED_HOT = { capacity: 10_000, refillPerSecond: 5_000 } as const;
export const LEASED_SMALL = { capacity: 250, refillPerSecond: 500, lease: { maxBatch: 50 } } as const;

/** Response header `<received ms> <responded ms>` the worker app sets on every response. */
export const SERVED_HEADER = 'x-served';

/**
 * Response header: how many requests this process had received and not yet answered when this one
 * arrived, itself included. The concurrency the app really saw, whatever the load generator meant to send.
 */
export const IN_FLIGHT_HEADER = 'x-in-flight';

/** Routes of the worker app that separate processes run against one Redis. */
@Controller()
export class WorkerController {
  /** Unlimited: for readiness probes and to open keep-alive connections. */
  @Get('ping')
  @SkipRateLimit()
  ping() {
    return { pid: process.pid, now: Date.now() };
  }

  /** One policy per API key. */
  @Get('single')
  @RateLimit({ capacity: B, refillPerSecond: R, keyBy: 'apiKey', name: 'single' })
  single() {
    return { ok: true };
  }

  /** One slowly refilling policy per API key. */
  @Get('slow')
  @RateLimit({ ...SLOW, keyBy: 'apiKey', name: 'slow' })
  slow() {
    return { ok: true };
  }

  /** A leased policy per API key, with the default lease (life 500 ms). */
  @Get('leased-hot')
  @RateLimit({ ...LEASED_HOT, keyBy: 'apiKey', name: 'leased-hot', lease: true })
  leasedHot() {
    return { ok: true };
  }

  /** A small leased policy per API key. */
  @Get('leased-small')
  @RateLimit({ ...LEASED_SMALL, keyBy: 'apiKey', name: 'leased-small' })
  leasedSmall() {
    return { ok: true };
  }

  /** Two policies with different identities: the burst per API key, the quota per IP. */
  @Get('double')
  @RateLimit({ capacity: B, refillPerSecond: R, keyBy: 'apiKey', name: 'double-burst' })
  @RateLimit({ ...HOURLY, keyBy: 'ip', name: 'double-hourly' })
  double() {
    return { ok: true };
  }
}
