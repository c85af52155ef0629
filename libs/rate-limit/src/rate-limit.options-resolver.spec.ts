import { resolveOptions } from './rate-limit.options-resolver.js';

describe('module options', () => {
  it('fills in every default', () => {
    expect(resolveOptions({})).toMatchObject({
      redis: 'redis://127.0.0.1:6379',
      store: 'redis',
      keyPrefix: 'rl:',
      failureMode: 'open',
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
