import { Controller, Get, Module, type Type } from '@nestjs/common';
import { Test, type TestingModule } from '@nestjs/testing';
import { RateLimit, RateLimitInsights, RateLimitModule, type RateLimitModuleOptions } from 'nest-redis-rate-limit';
import { startUp } from '../../support/start-up.js';

/**
 * Issue 33: the operator's input is checked as strictly as `forRoot`. `operations` itself stops the
 * start when wrong; every change with a bad field is a `RateLimitInputError` naming it, and nothing
 * changes (the audit trail and what is in force are the same after it). The memory store: no Redis.
 */
@Controller()
class PlansController {
  @Get('plans')
  @RateLimit({ capacity: 3, refillPerSecond: 1, name: 'plans', cost: 2 })
  plans() {
    return {};
  }
}

function appWith(options: Record<string, unknown>): Type {
  @Module({ imports: [RateLimitModule.forRoot({ store: 'memory', ...options } as RateLimitModuleOptions)], controllers: [PlansController] })
  class OperatorInputModule {}
  return OperatorInputModule;
}

describe('operations option', () => {
  it.each([
    [{ operations: 'yes' }, /operations must be true, false or \{ analytics\?, syncMs\?, blockedStatus\? \} \(got "yes"\)/],
    [{ operations: { syncMs: 100 } }, /operations.syncMs must be an integer from 250 to 10000 \(got 100\)/],
    [{ operations: { blockedStatus: 404 } }, /operations.blockedStatus must be 429 or 403 \(got 404\)/],
    [{ operations: { analytics: { topK: 5 } } }, /operations.analytics.topK must be an integer from 10 to 10000 \(got 5\)/],
    [{ operations: { analytic: true } }, /unknown key "analytic" in operations \(did you mean "analytics"\?\)/],
    [{ operations: { analytics: { retention: 2 } } }, /unknown key "retention" in operations.analytics/],
  ])('refuses %j at start-up', async (options, message) => {
    const result = await startUp(appWith(options));
    expect(result).toEqual({ phase: 'compile', message: expect.stringMatching(message) });
  });

  it('refuses operations beside a store of its own', async () => {
    const store = {
      remote: false,
      take: () => Promise.resolve({ allowed: true, tokens: [0], waits: [0] }),
      delete: () => Promise.resolve(),
    };
    const result = await startUp(appWith({ store, operations: true }));
    expect(result).toEqual({
      phase: 'compile',
      message: expect.stringMatching(/^RateLimitModule: operations needs the Redis store or the memory store/),
    });
  });

  it('says the operations are off when they are, with a code', async () => {
    const moduleRef = await Test.createTestingModule({ imports: [appWith({})] }).compile();
    const insights = moduleRef.get(RateLimitInsights);
    expect(insights.enabled).toBe(false);
    expect(() => insights.policies()).toThrow(expect.objectContaining({ code: 'ERR_RATE_LIMIT_OPERATIONS_OFF' }));
    await moduleRef.close();
  });
});

describe('RateLimitInsights input', () => {
  let moduleRef: TestingModule;
  let ops: RateLimitInsights;

  beforeAll(async () => {
    moduleRef = await Test.createTestingModule({ imports: [appWith({ operations: true })] }).compile();
    moduleRef.useLogger(false);
    await moduleRef.init();
    ops = moduleRef.get(RateLimitInsights);
  });

  afterAll(() => moduleRef.close());

  const by = 'ops';
  const reason = 'why';

  it.each([
    ['an unknown scope', { scope: 'nope', capacity: 5, by, reason }, /scope "nope" is not the name of a route policy/],
    ['no change at all', { scope: 'plans', by, reason }, /at least one of capacity, refillPerSecond, enforce/],
    ['a fractional capacity', { scope: 'plans', capacity: 2.5, by, reason }, /capacity must be an integer from 1/],
    ['a capacity below the cost', { scope: 'plans', capacity: 1, by, reason }, /capacity 1 is below the cost 2 of a request of plans/],
    ['a refill of 0', { scope: 'plans', refillPerSecond: 0, by, reason }, /refillPerSecond must be a finite number > 0/],
    ['an enforce that is not a boolean', { scope: 'plans', enforce: 'false', by, reason }, /enforce must be true or false/],
    ['an empty reason', { scope: 'plans', capacity: 5, by, reason: ' ' }, /reason must be a non-empty string/],
    ['a long reason', { scope: 'plans', capacity: 5, by, reason: 'x'.repeat(201) }, /reason must be at most 200 characters/],
    ['a control character', { scope: 'plans', capacity: 5, by: 'a\nb', reason }, /by must not contain control characters/],
    ['an unknown field', { scope: 'plans', capacity: 5, by, reason, capcity: 9 }, /unknown field "capcity"/],
    ['an identity not as keyed', { scope: 'plans', identity: 'bob', capacity: 5, by, reason }, /identity must be as the limiter keys it/],
    [
      'an identity with braces',
      { scope: 'plans', identity: 'user:{x}', capacity: 5, by, reason },
      /identity must be as the limiter keys it/,
    ],
    ['a ttl of 0', { scope: 'plans', capacity: 5, ttlSeconds: 0, by, reason }, /ttlSeconds must be an integer from 1/],
  ])('refuses an override with %s, and changes nothing', async (_, input, message) => {
    await expect(ops.setOverride(input as never)).rejects.toMatchObject({
      code: 'ERR_RATE_LIMIT_INVALID_OPERATION',
      message: expect.stringMatching(message),
    });
    expect(await ops.overrides()).toEqual([]);
    expect(await ops.audit()).toEqual([]);
  });

  it.each([
    ['a range too wide', { target: 'ip:10.0.0.0/7', seconds: 60, by, reason }, /an IPv4 range must be \/8 to \/32/],
    ['an IPv6 range narrower than a client', { target: 'ip:2001:db8::/80', seconds: 60, by, reason }, /an IPv6 range must be \/16 to \/64/],
    ['not an address', { target: 'ip:300.1.1.1', seconds: 60, by, reason }, /must name an IPv4 or IPv6 address/],
    ['a block of 0 s', { target: 'user:42', seconds: 0, by, reason }, /seconds must be an integer from 1 to 2592000/],
    ['a block longer than 30 days', { target: 'user:42', seconds: 2592001, by, reason }, /seconds must be an integer from 1 to 2592000/],
    ['an API key digest of the wrong length', { target: 'key:abc', seconds: 60, by, reason }, /must be as the limiter keys it/],
  ])('refuses a block with %s, and changes nothing', async (_, input, message) => {
    await expect(ops.block(input as never)).rejects.toMatchObject({
      code: 'ERR_RATE_LIMIT_INVALID_OPERATION',
      message: expect.stringMatching(message),
    });
    expect(await ops.blocks()).toEqual([]);
    expect(await ops.audit()).toEqual([]);
  });

  it('keys identities as the limiter does: an IPv6 address by its /64, an API key by its digest, never kept raw', async () => {
    const v6 = await ops.block({ target: 'ip:2001:db8:1:2:3:4:5:6', seconds: 60, by, reason });
    expect(v6.target).toBe('ip:2001:db8:1:2::');
    const inspected = await ops.inspect('plans', { apiKey: 'sk_live_secret_value' });
    expect(inspected.identity).toMatch(/^key:[0-9a-f]{32}$/);
    expect(JSON.stringify(await ops.audit())).not.toContain('sk_live_secret_value');
    // A message about a bad API key identity never repeats it.
    await expect(ops.inspect('plans', { apiKey: 7 } as never)).rejects.toMatchObject({ message: expect.not.stringContaining('7 ') });
    expect(await ops.unblock('ip:2001:db8:1:2:3:4:5:6', { by })).toBe(true);
    expect((await ops.audit()).map((e) => e.action)).toEqual(['unblock', 'block']);
  });
});
