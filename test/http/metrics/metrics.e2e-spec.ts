import { performance } from 'node:perf_hooks';
import type { INestApplication, LoggerService } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { metrics } from '@opentelemetry/api';
import { AggregationTemporality } from '@opentelemetry/sdk-metrics';
import { Redis } from 'ioredis';
import request from 'supertest';
import {
  RateLimitMetricAttributes,
  RateLimitMetricNames,
  RateLimitMetrics,
  RateLimitModule,
  type RateLimitModuleOptions,
} from 'nest-redis-rate-limit';
import { RateLimitEvents } from '../../../libs/rate-limit/src/events/rate-limit-events.js';
import { createApp, PLATFORMS } from '../../support/app.js';
import { deleteKeys, RedisServer, redisUrl, testPrefix } from '../../support/redis.js';
import { metricsAppModule } from './app.module.js';
import { Recorded } from './reader.js';

const DECISIONS = 'ratelimit.decisions';
const NEAR_LIMIT = 'ratelimit.near_limit';
const STORE_DURATION = 'ratelimit.store.duration';
const BREAKER_OPEN = 'ratelimit.store.breaker.open';
const CONCURRENCY_DECISIONS = 'ratelimit.concurrency.decisions';
const CONCURRENCY_HELD = 'ratelimit.concurrency.held';

/** The only attribute keys each metric may carry: bounded values, never an identity. */
const ATTRIBUTE_KEYS: Record<string, string[]> = {
  [DECISIONS]: ['ratelimit.outcome', 'ratelimit.scope', 'ratelimit.source'],
  [NEAR_LIMIT]: ['ratelimit.scope', 'ratelimit.source'],
  [STORE_DURATION]: ['ratelimit.store.outcome'],
  [BREAKER_OPEN]: [],
  [CONCURRENCY_DECISIONS]: ['ratelimit.outcome', 'ratelimit.scope', 'ratelimit.source'],
  [CONCURRENCY_HELD]: [],
};

const decision = (outcome: string, source: string, value: number, scope = 'metered') => ({
  attributes: { 'ratelimit.outcome': outcome, 'ratelimit.scope': scope, 'ratelimit.source': source },
  value,
});

/** Keeps the warnings the limiter logs. */
class WarningRecorder implements LoggerService {
  readonly warnings: string[] = [];
  log() {}
  error() {}
  warn(message: unknown, context?: unknown) {
    if (context === 'RateLimit') this.warnings.push(String(message));
  }
}

/** Every data point's attribute keys are the metric's own, and no value names the client. */
async function expectBoundedAttributes(recorded: Recorded): Promise<void> {
  const all = await recorded.collect();
  for (const [name, metric] of all) {
    expect(Object.keys(ATTRIBUTE_KEYS)).toContain(name);
    for (const point of metric.dataPoints) {
      expect([name, Object.keys(point.attributes).sort()]).toEqual([name, ATTRIBUTE_KEYS[name]]);
      for (const value of Object.values(point.attributes)) expect(String(value)).not.toMatch(/127\.0\.0\.1|::1|ip:|user:|key:/);
    }
  }
}

it('exports the names it records under', () => {
  expect(RateLimitMetricNames).toEqual({
    decisions: DECISIONS,
    nearLimit: NEAR_LIMIT,
    storeDuration: STORE_DURATION,
    breakerOpen: BREAKER_OPEN,
    concurrencyDecisions: CONCURRENCY_DECISIONS,
    concurrencyHeld: CONCURRENCY_HELD,
  });
  expect(Object.values(RateLimitMetricAttributes).sort()).toEqual([
    'ratelimit.outcome',
    'ratelimit.scope',
    'ratelimit.source',
    'ratelimit.store.outcome',
  ]);
});

describe.each(PLATFORMS)('OpenTelemetry metrics on %s', (platform) => {
  const prefix = testPrefix(`metrics-${platform}`);
  let client: Redis;
  const apps: INestApplication[] = [];
  const providers: Recorded[] = [];

  async function start(options: RateLimitModuleOptions, logger?: LoggerService): Promise<INestApplication> {
    const app = await createApp(
      metricsAppModule({ redis: await redisUrl(), keyPrefix: `${prefix}${apps.length}:`, ...options }),
      platform,
      logger === undefined ? undefined : (nest) => nest.useLogger(logger),
    );
    apps.push(app);
    return app;
  }

  function sdk(temporality?: AggregationTemporality): Recorded {
    const recorded = new Recorded(temporality);
    providers.push(recorded);
    return recorded;
  }

  const get = (app: INestApplication, path = '/metered') => request(app.getHttpServer()).get(path);

  beforeAll(async () => {
    client = new Redis(await redisUrl());
  });

  afterEach(() => {
    // A test that registered a global provider leaves none behind.
    metrics.disable();
  });

  afterAll(async () => {
    await Promise.all(apps.map((app) => app.close()));
    await Promise.all(providers.map((recorded) => recorded.shutdown()));
    await deleteKeys(client, prefix);
    await client.quit();
  });

  it('counts 3 requests on capacity 2 as allowed 2 and denied 1 (scope, source store), 1 near the limit, 3 store calls, breaker 0', async () => {
    const recorded = sdk();
    const app = await start({ metrics: { meterProvider: recorded.provider } });
    const started = performance.now();
    const statuses = [];
    for (let i = 0; i < 3; i++) statuses.push((await get(app)).status);
    const elapsedSeconds = (performance.now() - started) / 1000;
    expect(statuses).toEqual([200, 200, 429]);

    expect(await recorded.counts(DECISIONS)).toEqual([decision('allowed', 'store', 2), decision('denied', 'store', 1)]);
    // Remaining 1 of 2 is not below 10% of the capacity; remaining 0 is.
    expect(await recorded.counts(NEAR_LIMIT)).toEqual([
      { attributes: { 'ratelimit.scope': 'metered', 'ratelimit.source': 'store' }, value: 1 },
    ]);
    const durations = await recorded.histogramCounts(STORE_DURATION);
    expect(durations.map(({ attributes, count }) => ({ attributes, count }))).toEqual([
      { attributes: { 'ratelimit.store.outcome': 'ok' }, count: 3 },
    ]);
    // In seconds: the store's share of the three requests cannot exceed their wall time.
    expect(durations[0].sum).toBeGreaterThan(0);
    expect(durations[0].sum).toBeLessThanOrEqual(elapsedSeconds);
    expect((await recorded.collect()).get(STORE_DURATION)?.descriptor.unit).toBe('s');
    expect((await recorded.collect()).get(DECISIONS)?.descriptor.unit).toBe('{decision}');
    expect((await recorded.points(BREAKER_OPEN)).map((p) => p.value)).toEqual([0]);

    // The fourth is denied by the deny cache: a decision with source cache, and no store call.
    await get(app).expect(429);
    expect(await recorded.counts(DECISIONS)).toEqual([
      decision('allowed', 'store', 2),
      decision('denied', 'cache', 1),
      decision('denied', 'store', 1),
    ]);
    expect((await recorded.histogramCounts(STORE_DURATION)).map((d) => d.count)).toEqual([3]);
    await expectBoundedAttributes(recorded);
  });

  it('counts an unnamed policy under Controller.handler, never under the client', async () => {
    const recorded = sdk();
    const app = await start({ metrics: { meterProvider: recorded.provider } });
    for (let i = 0; i < 3; i++) await get(app, '/metered/unnamed').expect(200);
    expect(await recorded.counts(DECISIONS)).toEqual([decision('allowed', 'store', 3, 'MeteredController.unnamed')]);
    expect(await recorded.counts(NEAR_LIMIT)).toEqual([]);
    await expectBoundedAttributes(recorded);
  });

  it('counts near the limit only below 10 % of the capacity: capacity 20, remaining 2 is not, 1 and 0 are', async () => {
    const recorded = sdk();
    const app = await start({ metrics: { meterProvider: recorded.provider } });
    const near = async () => (await recorded.counts(NEAR_LIMIT)).map((point) => point.value);
    const NEAR = { 'ratelimit.scope': 'MeteredController.unnamed', 'ratelimit.source': 'store' };
    // 18 requests leave 19 down to 2 tokens: 2 is exactly 10 % of 20, not below it.
    for (let i = 0; i < 18; i++) await get(app, '/metered/unnamed').expect(200);
    expect(await near()).toEqual([]);
    const nineteenth = await get(app, '/metered/unnamed').expect(200);
    expect(nineteenth.headers['x-ratelimit-remaining']).toBe('1');
    expect(await recorded.counts(NEAR_LIMIT)).toEqual([{ attributes: NEAR, value: 1 }]);
    const twentieth = await get(app, '/metered/unnamed').expect(200);
    expect(twentieth.headers['x-ratelimit-remaining']).toBe('0');
    expect(await near()).toEqual([2]);
    // A denial is not near the limit: it is over it (counted as denied).
    await get(app, '/metered/unnamed').expect(429);
    expect(await near()).toEqual([2]);
    expect(await recorded.counts(DECISIONS)).toEqual([
      decision('allowed', 'store', 20, 'MeteredController.unnamed'),
      decision('denied', 'store', 1, 'MeteredController.unnamed'),
    ]);
  });

  it("reads the breaker as 1 while the store fails (failureMode 'open'): 5 decisions allowed by open, 5 store errors", async () => {
    const recorded = sdk();
    const app = await start({ redis: 'redis://127.0.0.1:1', failureMode: 'open', metrics: { meterProvider: recorded.provider } });
    for (let i = 0; i < 5; i++) await get(app).expect(200);
    expect((await recorded.points(BREAKER_OPEN)).map((p) => p.value)).toEqual([1]);
    expect(await recorded.counts(DECISIONS)).toEqual([decision('allowed', 'open', 5)]);
    // Requests one after another: each is the probe once the breaker is open, so each asks the store.
    expect((await recorded.histogramCounts(STORE_DURATION)).map(({ attributes, count }) => ({ attributes, count }))).toEqual([
      { attributes: { 'ratelimit.store.outcome': 'error' }, count: 5 },
    ]);
    await expectBoundedAttributes(recorded);
  });

  it('counts what a shadow policy would have refused as shadow-denied (the request went on), never as near the limit', async () => {
    const recorded = sdk();
    const app = await start({ metrics: { meterProvider: recorded.provider } });
    for (let i = 0; i < 3; i++) await get(app, '/metered/shadow').expect(200);
    expect(await recorded.counts(DECISIONS)).toEqual([
      decision('allowed', 'store', 1, 'shadowed'),
      // The third is answered by the deny cache, as an enforced policy's would be.
      decision('shadow-denied', 'cache', 1, 'shadowed'),
      decision('shadow-denied', 'store', 1, 'shadowed'),
    ]);
    // The allowed one left 0 of 1.
    expect(await recorded.counts(NEAR_LIMIT)).toEqual([
      { attributes: { 'ratelimit.scope': 'shadowed', 'ratelimit.source': 'store' }, value: 1 },
    ]);
  });

  it('follows the breaker: 0 while Redis answers, 1 once it has failed 3 times in a row, 0 again after it answers', async () => {
    const recorded = sdk();
    const server = await RedisServer.start();
    try {
      const app = await start({ redis: server.url, failureMode: 'open', metrics: { meterProvider: recorded.provider } });
      const breaker = async () => (await recorded.points(BREAKER_OPEN)).map((p) => p.value);
      await get(app).expect(200);
      expect(await breaker()).toEqual([0]);
      await server.stop();
      for (let i = 0; i < 2; i++) await get(app).expect(200);
      // Two failures in a row: not yet.
      expect(await breaker()).toEqual([0]);
      await get(app).expect(200);
      expect(await breaker()).toEqual([1]);
      await server.start();
      const deadline = Date.now() + 10_000;
      const fromStore = async () =>
        (await recorded.counts(DECISIONS)).filter((d) => d.attributes['ratelimit.source'] === 'store').reduce((n, d) => n + d.value, 0);
      while ((await fromStore()) < 2 && Date.now() < deadline) {
        await get(app);
        await new Promise((r) => setTimeout(r, 50));
      }
      expect(await fromStore()).toBeGreaterThanOrEqual(2);
      expect(await breaker()).toEqual([0]);
    } finally {
      await server.stop();
    }
  });

  it('stops reporting the breaker once its app is closed (the provider outlives it)', async () => {
    // Delta: a collection holds only what was observed since the last one, not the value kept from before.
    const recorded = sdk(AggregationTemporality.DELTA);
    const app = await createApp(
      metricsAppModule({ redis: await redisUrl(), keyPrefix: `${prefix}closed:`, metrics: { meterProvider: recorded.provider } }),
      platform,
    );
    await get(app).expect(200);
    expect((await recorded.points(BREAKER_OPEN)).map((p) => p.value)).toEqual([0]);
    await app.close();
    expect(await recorded.points(BREAKER_OPEN)).toEqual([]);
  });

  it('records through the global MeterProvider an SDK registered before app.init()', async () => {
    const recorded = sdk();
    expect(metrics.setGlobalMeterProvider(recorded.provider)).toBe(true);
    const app = await start({});
    expect(app.get(RateLimitMetrics).enabled).toBe(true);
    expect(app.get(RateLimitEvents).decisionsWatched).toBe(true);
    await get(app).expect(200);
    expect(await recorded.counts(DECISIONS)).toEqual([decision('allowed', 'store', 1)]);
  });

  it('subscribes nothing without an SDK: no decision events are built, no store call is timed', async () => {
    const app = await start({});
    await get(app).expect(200);
    expect(app.get(RateLimitMetrics).enabled).toBe(false);
    expect(app.get(RateLimitEvents).decisionsWatched).toBe(false);
    expect(app.get(RateLimitEvents).storeWatched).toBe(false);
  });

  it('metrics: true without an SDK subscribes nothing and says why at start-up', async () => {
    const warnings = new WarningRecorder();
    const app = await start({ metrics: true }, warnings);
    expect(app.get(RateLimitEvents).decisionsWatched).toBe(false);
    // Nest's logger is global: other apps of this file (a failing Redis) may log meanwhile.
    const aboutMetrics = (recorder: WarningRecorder) => recorder.warnings.filter((w) => /metrics|MeterProvider/.test(w));
    expect(aboutMetrics(warnings)).toEqual([
      expect.stringMatching(/^metrics: true, but no OpenTelemetry MeterProvider is registered: nothing is recorded\. Start the SDK/),
    ]);
    const quiet = new WarningRecorder();
    await start({}, quiet);
    expect(aboutMetrics(quiet)).toEqual([]);
  });

  it('looks the global provider up at bootstrap: one registered after app.init() is not used', async () => {
    const app = await start({});
    const recorded = sdk();
    metrics.setGlobalMeterProvider(recorded.provider);
    await get(app).expect(200);
    expect(app.get(RateLimitEvents).decisionsWatched).toBe(false);
    expect(await recorded.collect()).toEqual(new Map());
  });

  it('metrics: false records nothing even with an SDK registered', async () => {
    const recorded = sdk();
    metrics.setGlobalMeterProvider(recorded.provider);
    const app = await start({ metrics: false });
    await get(app).expect(200);
    expect(app.get(RateLimitEvents).decisionsWatched).toBe(false);
    expect(app.get(RateLimitEvents).storeWatched).toBe(false);
    expect(await recorded.collect()).toEqual(new Map());
  });
});

describe('the metrics option', () => {
  it.each([
    ['a string', 'yes', /\(got "yes"\)/],
    ['a number', 1, /\(got 1\)/],
    ['null', null, /\(got null\)/],
    ['an object without meterProvider', {}, /\(got \{\}\)/],
    ['a meterProvider without getMeter()', { meterProvider: {} }, /\(got \{ meterProvider \}\)/],
  ])('stops the start on %s', async (_, value, got) => {
    const compiling = Test.createTestingModule({
      imports: [RateLimitModule.forRoot({ store: 'memory', metrics: value as RateLimitModuleOptions['metrics'] })],
    })
      .setLogger({ log() {}, error() {}, warn() {} })
      .compile();
    await expect(compiling).rejects.toThrow(/^RateLimitModule: metrics must be true, false or \{ meterProvider \}/);
    await expect(compiling).rejects.toThrow(got);
  });
});
