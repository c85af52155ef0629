import { Test, type TestingModule } from '@nestjs/testing';
import { BucketService, RateLimitModule, RateLimitUnavailableError } from 'nest-redis-rate-limit';
import { LogRecorder } from '../../support/log-recorder.js';
import { redisUrl } from '../../support/redis.js';
import { redisScenario } from '../../support/scenario.js';

/**
 * Issue 32, item 3: a key of another type where a bucket should be (another application on the same
 * Redis, a bad migration) fails that bucket's decision only. The other decisions that share its script
 * call (coalescing) are decided as usual, and the breaker does not count it: one bad key never switches
 * limiting off ('open') or on for everybody ('closed'). A hash with unreadable fields is repaired, as ever.
 */
const POLICY = { capacity: 20, refillPerSecond: 1 };

describe('a bucket key that holds another type (WRONGTYPE)', () => {
  const scenario = redisScenario('wrong-type');
  const modules: TestingModule[] = [];

  afterAll(async () => {
    for (const moduleRef of modules) await moduleRef.close();
  });

  async function start(failureMode: 'open' | 'closed') {
    const keyPrefix = scenario.nextKeyPrefix();
    const recorder = new LogRecorder();
    const moduleRef = await Test.createTestingModule({
      imports: [RateLimitModule.forRoot({ redis: await redisUrl(), keyPrefix, failureMode, timeoutMs: 2_000 })],
    }).compile();
    moduleRef.useLogger(recorder);
    await moduleRef.init();
    modules.push(moduleRef);
    const client = scenario.client;
    // Another application's keys where three clients' buckets would be, and a hash with garbage in it.
    await client.set(`${keyPrefix}{string}`, 'not a bucket');
    await client.rpush(`${keyPrefix}{list}`, 'a', 'b');
    await client.hset(`${keyPrefix}{hash}`, { tokens: 'lots', ts: 'yesterday' });
    return { buckets: moduleRef.get(BucketService), recorder, keyPrefix };
  }

  /** One burst, in one event-loop turn (so the decisions share script calls): 4 healthy clients × 50, 3 bad keys × 10. */
  async function burst(buckets: BucketService) {
    const started = Date.now();
    const calls: Promise<{ name: string; allowed: boolean | 'unavailable' }>[] = [];
    for (let i = 0; i < 50; i++) {
      for (const name of ['a', 'b', 'c', 'd', ...(i < 10 ? ['string', 'list', 'hash'] : [])]) {
        calls.push(
          buckets.consume(name, POLICY).then(
            (decision) => ({ name, allowed: decision.allowed }),
            (error: unknown) => {
              if (error instanceof RateLimitUnavailableError) return { name, allowed: 'unavailable' as const };
              throw error;
            },
          ),
        );
      }
    }
    const results = await Promise.all(calls);
    const seconds = (Date.now() - started) / 1000;
    const count = (name: string, value: boolean | 'unavailable') => results.filter((r) => r.name === name && r.allowed === value).length;
    return { count, seconds };
  }

  it.each(['open', 'closed'] as const)(
    "decides healthy clients exactly beside a string, a list and a corrupt hash in the same calls (failureMode '%s')",
    async (failureMode) => {
      const { buckets, recorder, keyPrefix } = await start(failureMode);
      const { count, seconds } = await burst(buckets);
      for (const name of ['a', 'b', 'c', 'd']) {
        // B = 20 and the refill of the burst's own time (R = 1/s): never the 50 a failed call lets through in 'open'.
        expect(count(name, true)).toBeGreaterThanOrEqual(20);
        expect(count(name, true)).toBeLessThanOrEqual(20 + Math.ceil(seconds));
        expect(count(name, 'unavailable')).toBe(0);
      }
      // The corrupt hash counts as a full bucket (repaired): all 10 of its calls are allowed, and it holds 10.
      expect(count('hash', true)).toBe(10);
      expect(Number(await scenario.client.hget(`${keyPrefix}{hash}`, 'tokens'))).toBeCloseTo(10, 0);
      // The other types' calls get failureMode's answer, and their keys are left as they were.
      for (const name of ['string', 'list']) expect(count(name, failureMode === 'open' ? true : 'unavailable')).toBe(10);
      expect(await scenario.client.get(`${keyPrefix}{string}`)).toBe('not a bucket');
      expect(await scenario.client.lrange(`${keyPrefix}{list}`, 0, -1)).toEqual(['a', 'b']);
      // Said once (throttled), naming a key and the code; the store is not reported as failing, and the next
      // healthy decision is the store's own (a fresh bucket: 19 left), not failureMode's.
      const warnings = recorder.of('RateLimit', 'warn');
      expect(warnings.filter((w) => w.includes('WRONGTYPE'))).toHaveLength(1);
      expect(warnings.filter((w) => w.includes('WRONGTYPE'))[0]).toMatch(
        new RegExp(`unusable key: bucket 1 \\(${keyPrefix}\\{(string|list)\\}\\)`),
      );
      expect(warnings.filter((w) => w.includes('store failed'))).toEqual([]);
      expect(await buckets.consume('fresh', POLICY)).toMatchObject({ allowed: true, remaining: 19 });
    },
  );
});
