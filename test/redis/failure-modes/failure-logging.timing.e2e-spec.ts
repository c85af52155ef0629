import { Logger } from '@nestjs/common';
import { Test, type TestingModule } from '@nestjs/testing';
import { Redis } from 'ioredis';
import { BucketService, type FailureMode, RateLimitModule, RedisBucketStore } from 'nest-redis-rate-limit';
import { ThrottledLogger } from '../../../libs/rate-limit/src/throttled-logger.js';
import { sleep } from '../../support/load.js';
import { LogRecorder } from '../../support/log-recorder.js';
import { RedisServer, redisUrl, testPrefix } from '../../support/redis.js';
import { MODES, TIMEOUT_MS } from './scenario.js';

const EFFECT: Record<FailureMode, string> = {
  open: 'requests are allowed without a limit',
  closed: 'requests are refused (503)',
  local: 'requests are limited by in-process buckets',
};

describe('what the limiter logs while Redis fails', () => {
  const recorder = new LogRecorder();

  // Compiling a testing module installs its own logger: install the recorder before every test.
  beforeEach(() => {
    Logger.overrideLogger(recorder);
    recorder.clear();
  });
  afterAll(() => Logger.overrideLogger(false));

  describe.each(MODES)("failureMode '%s'", (mode) => {
    const prefix = testPrefix(`failure-logging-${mode}`);
    let server: RedisServer;
    let moduleRef: TestingModule;
    let buckets: BucketService;
    const request = { key: `${prefix}{logged}`, capacity: 5, refillPerSecond: 1, cost: 1 };

    beforeAll(async () => {
      server = await RedisServer.start();
      await server.stop();
      moduleRef = await Test.createTestingModule({
        imports: [RateLimitModule.forRoot({ redis: server.url, keyPrefix: prefix, failureMode: mode, timeoutMs: TIMEOUT_MS })],
      }).compile();
      await moduleRef.init();
      buckets = moduleRef.get(BucketService);
    });

    afterAll(async () => {
      try {
        await moduleRef?.close();
      } finally {
        // Even if closing failed.
        await server?.stop();
      }
    });

    it('logs one warning for 200 failed decisions, naming the error and what requests get', async () => {
      for (let i = 0; i < 200; i++) expect((await buckets.decide([request])).source).toBe(mode);
      const warnings = recorder.of('RateLimit', 'warn');
      expect(warnings).toHaveLength(1);
      expect(warnings[0]).toMatch(
        new RegExp(
          `^Rate-limit store failed: .+; ${EFFECT[mode].replace(/[()]/g, '\\$&')} until it answers again \\(failureMode '${mode}'\\)$`,
        ),
      );
    });

    it('logs once that Redis answers again, with how many decisions the failure mode made', async () => {
      await server.start();
      let source = '';
      for (let i = 0; source !== 'store' && i < 200; i++) {
        source = (await buckets.decide([request])).source;
        if (source !== 'store') await sleep(50);
      }
      expect(source).toBe('store');
      await buckets.decide([request]);
      const recovered = recorder.of('RateLimit', 'log');
      expect(recovered).toHaveLength(1);
      const degraded = Number(/answers again; (\d+) decision\(s\) followed failureMode '(\w+)' meanwhile$/.exec(recovered[0])?.[1]);
      expect(degraded).toBeGreaterThanOrEqual(200);
      expect(recovered[0]).toContain(`failureMode '${mode}'`);
    });
  });

  it('holds back repeats for the interval, then logs the next with how many were held back', async () => {
    const logger = new ThrottledLogger('Throttled', 150);
    for (let i = 0; i < 5; i++) logger.warn(`failure ${i}`);
    logger.log('recovered');
    logger.log('recovered again');
    expect(recorder.of('Throttled', 'warn')).toEqual(['failure 0']);
    // Each level has its own clock: a recovery line is not swallowed by a recent warning.
    expect(recorder.of('Throttled', 'log')).toEqual(['recovered']);
    await sleep(200);
    logger.warn('failure 5');
    expect(recorder.of('Throttled', 'warn')).toEqual(['failure 0', 'failure 5 (4 more like it since the last one)']);
  });

  it('warns at start-up when the Redis client it is given would queue commands while disconnected', async () => {
    const url = await redisUrl();
    const queueing = new Redis(url, { lazyConnect: true });
    const failFast = new Redis(url, { lazyConnect: true, enableOfflineQueue: false });
    try {
      new RedisBucketStore(queueing, false);
      new RedisBucketStore(failFast, false);
      expect(recorder.of('RateLimit', 'warn')).toEqual([
        'The Redis client given to RateLimitModule queues commands while disconnected, so decisions that ' +
          'timed out are replayed when it reconnects: create it with { enableOfflineQueue: false }',
      ]);
    } finally {
      queueing.disconnect();
      failFast.disconnect();
    }
  });
});
