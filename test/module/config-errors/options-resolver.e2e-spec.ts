import { resolveOptions } from '../../../libs/rate-limit/src/rate-limit.options-resolver.js';

describe('module options', () => {
  it('fills in every default', () => {
    expect(resolveOptions({})).toMatchObject({
      redis: 'redis://127.0.0.1:6379',
      store: 'redis',
      keyPrefix: 'rl:',
      failureMode: 'local',
      maxLocalBuckets: 100_000,
      timeoutMs: 100,
      legacyHeaders: true,
      standardHeaders: 'draft-6',
      apiKeyHeader: 'x-api-key',
      defaults: [],
    });
  });

  it.each([
    [{ standardHeaders: 'draft-9' }, /standardHeaders must be one of 'draft-6', 'draft-7', 'draft-8', false \(got "draft-9"\)/],
    [{ failureMode: 'retry' }, /failureMode must be one of 'open', 'closed', 'local'/],
    [{ store: 'postgres' }, /store must be 'redis', 'memory' or a BucketStore/],
    [{ timeoutMs: 0 }, /timeoutMs must be a finite number > 0 \(got 0\)/],
    [{ timeoutMs: 3e9 }, /timeoutMs must be at most 2147483647 \(a Node timer's limit\) \(got 3000000000\)/],
    [{ timeoutMs: 2 ** 31 }, /timeoutMs must be at most 2147483647/],
    [{ keyPrefix: 'a{b}' }, /keyPrefix must be at most 64 characters without braces/],
    [{ keys: { apiKeyHeader: 'x api key' } }, /keys.apiKeyHeader must be a header name/],
    [{ maxLocalBuckets: 0 }, /maxLocalBuckets must be an integer from 1 to 16777216 \(got 0\)/],
    [{ maxLocalBuckets: 2.5 }, /maxLocalBuckets must be an integer from 1 to 16777216 \(got 2.5\)/],
    [{ maxLocalBuckets: 2 ** 24 + 1 }, /maxLocalBuckets must be an integer from 1 to 16777216 \(got 16777217\)/],
    [{ maxLocalBuckets: '1000' }, /maxLocalBuckets must be an integer from 1 to 16777216 \(got "1000"\)/],
  ])('rejects %j with a message that says what is allowed', (options, message) => {
    expect(() => resolveOptions(options as never)).toThrow(message);
  });

  it('accepts the largest timeoutMs a Node timer can wait (2^31 - 1 ms)', () => {
    expect(resolveOptions({ timeoutMs: 2 ** 31 - 1 }).timeoutMs).toBe(2_147_483_647);
  });
});

describe('module options: acquire', () => {
  it('defaults to a wait of at most 60 s and 10,000 waiting calls', () => {
    expect(resolveOptions({})).toMatchObject({ acquireMaxWaitMs: 60_000, acquireMaxWaiting: 10_000 });
    expect(resolveOptions({ acquire: {} })).toMatchObject({ acquireMaxWaitMs: 60_000, acquireMaxWaiting: 10_000 });
  });

  it('takes each bound as given, down to 0 ms of wait and 1 waiting call, up to the largest of each', () => {
    expect(resolveOptions({ acquire: { maxWaitMs: 0, maxWaiting: 1 } })).toMatchObject({ acquireMaxWaitMs: 0, acquireMaxWaiting: 1 });
    expect(resolveOptions({ acquire: { maxWaitMs: 2500 } })).toMatchObject({ acquireMaxWaitMs: 2500, acquireMaxWaiting: 10_000 });
    expect(resolveOptions({ acquire: { maxWaiting: 7 } })).toMatchObject({ acquireMaxWaitMs: 60_000, acquireMaxWaiting: 7 });
    expect(resolveOptions({ acquire: { maxWaitMs: 2 ** 31 - 1, maxWaiting: 2 ** 24 } })).toMatchObject({
      acquireMaxWaitMs: 2_147_483_647,
      acquireMaxWaiting: 16_777_216,
    });
  });

  it.each([
    [{ maxWait: 5 }, 'RateLimitModule: unknown key "maxWait" in acquire (did you mean "maxWaitMs"?)'],
    [{ maxWaiting: 3, timeoutMs: 10 }, 'RateLimitModule: unknown key "timeoutMs" in acquire (known keys: maxWaitMs, maxWaiting)'],
  ])('refuses the unknown key of acquire %j, naming it', (acquire, reason) => {
    expect(() => resolveOptions({ acquire } as never)).toThrow(expect.objectContaining({ code: 'ERR_RATE_LIMIT_UNKNOWN_OPTION', reason }));
  });

  it.each([
    [5, /acquire must be \{ maxWaitMs\?, maxWaiting\? \} \(got 5\)/],
    ['fast', /acquire must be \{ maxWaitMs\?, maxWaiting\? \} \(got "fast"\)/],
    [{ maxWaitMs: -1 }, /acquire.maxWaitMs must be an integer from 0 to 2147483647 \(got -1\)/],
    [{ maxWaitMs: 1.5 }, /acquire.maxWaitMs must be an integer from 0 to 2147483647 \(got 1.5\)/],
    [{ maxWaitMs: 2 ** 31 }, /acquire.maxWaitMs must be an integer from 0 to 2147483647 \(got 2147483648\)/],
    [{ maxWaitMs: '1000' }, /acquire.maxWaitMs must be an integer from 0 to 2147483647 \(got "1000"\)/],
    [{ maxWaitMs: Number.NaN }, /acquire.maxWaitMs must be an integer from 0 to 2147483647 \(got null\)/],
    [{ maxWaiting: 0 }, /acquire.maxWaiting must be an integer from 1 to 16777216 \(got 0\)/],
    [{ maxWaiting: 2 ** 24 + 1 }, /acquire.maxWaiting must be an integer from 1 to 16777216 \(got 16777217\)/],
    [{ maxWaiting: 2.5 }, /acquire.maxWaiting must be an integer from 1 to 16777216 \(got 2.5\)/],
  ])('refuses acquire %j with the code ERR_RATE_LIMIT_INVALID_OPTION and what is allowed', (acquire, message) => {
    expect(() => resolveOptions({ acquire } as never)).toThrow(message);
    expect(() => resolveOptions({ acquire } as never)).toThrow(expect.objectContaining({ code: 'ERR_RATE_LIMIT_INVALID_OPTION' }));
  });
});
