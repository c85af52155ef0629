import { Body, Controller, type ExecutionContext, type INestApplication, Logger, Module, Post } from '@nestjs/common';
import { Redis } from 'ioredis';
import request from 'supertest';
import { RateLimit, RateLimitModule } from 'nest-redis-rate-limit';
import { createApp, PLATFORMS, type Platform } from '../../support/app.js';
import { LogRecorder } from '../../support/log-recorder.js';
import { deleteKeys, redisUrl, testPrefix, tokensOf } from '../../support/redis.js';

/**
 * Issue 22, finding 4: a cost computed from the request body. An invalid answer (0, 2.5, -1: the client's
 * doing) is a 400 that says why, never a 500; and whatever phase 2 throws, phase 1's tokens go back.
 */
const SLOW = 0.001;
const body = (context: ExecutionContext) => context.switchToHttp().getRequest().body;

@Controller('cost')
class CostController {
  /** The README's example as 0.2.0 printed it: `{ "queries": [] }` gives 0. */
  @Post('search')
  @RateLimit({ capacity: 100, refillPerSecond: 10, cost: (c) => Math.min(100, body(c).queries?.length ?? 1) })
  search(@Body() _body: unknown) {
    return { ok: true };
  }

  /** A per-IP policy decided before the app's guards (phase 1), and a cost from the body after them (phase 2). */
  @Post('two-phases')
  @RateLimit({ capacity: 5, refillPerSecond: SLOW, name: 'per-ip' })
  @RateLimit({ capacity: 10, refillPerSecond: SLOW, name: 'by-size', cost: (c) => body(c).n })
  twoPhases() {
    return { ok: true };
  }

  /** Phase 2 throws (the cost function fails, no fallback: 500): phase 1 must still be given back. */
  @Post('throws')
  @RateLimit({ capacity: 5, refillPerSecond: SLOW, name: 'per-ip-2' })
  @RateLimit({
    capacity: 10,
    refillPerSecond: SLOW,
    name: 'broken',
    cost: () => {
      throw new Error('size service down');
    },
  })
  throws() {
    return { ok: true };
  }

  /** The same, with the phase-1 policy in shadow mode: it drains what it would enforced, so it is given back too. */
  @Post('throws-shadow')
  @RateLimit({ capacity: 5, refillPerSecond: SLOW, name: 'per-ip-shadow', enforce: false })
  @RateLimit({
    capacity: 10,
    refillPerSecond: SLOW,
    name: 'broken-2',
    cost: () => {
      throw new Error('size service down');
    },
  })
  throwsShadow() {
    return { ok: true };
  }
}

describe.each(PLATFORMS)('a cost computed from the request on %s', (platform: Platform) => {
  const prefix = testPrefix(`request-cost-${platform}`);
  const logs = new LogRecorder();
  let client: Redis;
  let app: INestApplication;
  let url: string;
  const ipKey = (scope: string) => `${prefix}{ip:127.0.0.1}:${scope}`;

  beforeAll(async () => {
    client = new Redis(await redisUrl());
    @Module({ imports: [RateLimitModule.forRoot({ redis: await redisUrl(), keyPrefix: prefix })], controllers: [CostController] })
    class CostModule {}
    app = await createApp(CostModule, platform);
    Logger.overrideLogger(logs);
    await app.listen(0, '127.0.0.1');
    url = await app.getUrl();
  });

  afterAll(async () => {
    await app?.close();
    await deleteKeys(client, prefix);
    await client.quit();
    Logger.overrideLogger(false);
  });

  it('answers 400 saying why for a cost of 0, 2.5 or -1 from the body, takes nothing, and still charges a valid one exactly', async () => {
    for (const [queries, got] of [
      [[], '0'],
      [{ length: 2.5 }, '2.5'],
      [{ length: -1 }, '-1'],
    ] as const) {
      const response = await request(url).post('/cost/search').send({ queries });
      expect(response.status).toBe(400);
      expect(response.body).toEqual({
        statusCode: 400,
        error: 'Bad Request',
        message: `The rate-limit cost of this request must be an integer from 1 to 100 (got ${got})`,
      });
    }
    // Nothing was taken by the refused requests: the bucket does not exist yet.
    expect(await client.exists(ipKey('CostController.search'))).toBe(0);
    const valid = await request(url)
      .post('/cost/search')
      .send({ queries: [1, 2, 3] })
      .expect(201);
    expect(valid.headers['x-ratelimit-remaining']).toBe('97');
    // Logged once for the route, for its developer: the body is the client's, the function is theirs.
    const warned = logs.of('RateLimit', 'warn').filter((m) => m.includes('CostController.search'));
    expect(warned).toHaveLength(1);
    expect(warned[0]).toContain('refused with 400');
  });

  it('gives phase 1 back, exactly, when phase 2 refuses the request with 400 for its cost', async () => {
    await request(url).post('/cost/two-phases').send({ n: 2 }).expect(201);
    expect(await tokensOf(client, ipKey('per-ip'))).toBeCloseTo(4, 2);
    expect(await tokensOf(client, ipKey('by-size'))).toBeCloseTo(8, 2);
    for (const n of [0, 2.5, -1, 11]) await request(url).post('/cost/two-phases').send({ n }).expect(400);
    // Before the fix each 500 kept its phase-1 token: 4 would have become 0.
    expect(await tokensOf(client, ipKey('per-ip'))).toBeCloseTo(4, 2);
    expect(await tokensOf(client, ipKey('by-size'))).toBeCloseTo(8, 2);
  });

  it('gives phase 1 back, exactly, when phase 2 throws (a failing cost function without fallback: 500)', async () => {
    for (let i = 0; i < 3; i++) {
      const response = await request(url).post('/cost/throws').send({}).expect(500);
      expect(response.body.message).toBe('The rate limit of this route could not be computed');
    }
    expect(await tokensOf(client, ipKey('per-ip-2'))).toBeCloseTo(5, 2);
  });

  it("gives a shadow policy's phase-1 tokens back too when phase 2 throws, as it would enforced", async () => {
    for (let i = 0; i < 3; i++) await request(url).post('/cost/throws-shadow').send({}).expect(500);
    expect(await tokensOf(client, ipKey('per-ip-shadow'))).toBeCloseTo(5, 2);
  });
});
