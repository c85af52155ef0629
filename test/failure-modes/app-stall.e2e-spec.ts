import { Controller, Get, type INestApplication, Module } from '@nestjs/common';
import { RateLimit, RateLimitModule, type RateLimitDecisionEvent } from 'nest-redis-rate-limit';
import { createApp, PLATFORMS } from '../support/app.js';
import { burst } from '../support/burst.js';
import { redisUrl, testPrefix } from '../support/redis.js';

/**
 * The deadline measures Redis, not the app (issue 20 item 1). With the default options
 * (failureMode 'open', timeoutMs 100) and a healthy Redis, time in which the app's own event loop
 * could not run must never become a timeout, a breaker trip or an admission without a decision.
 */
const CAPACITY = 5;
const BLOCK_MS = 300;

@Controller()
class StallController {
  /** 5 tokens, refilled after 1000 s: every admission beyond 5 per client would be a broken promise. */
  @Get('limited')
  @RateLimit(CAPACITY, 0.001)
  limited() {
    return { ok: true };
  }

  /** A handler of the same app that holds the event loop (a bcrypt hash, a large JSON): not limited. */
  @Get('block')
  block() {
    const until = performance.now() + BLOCK_MS;
    while (performance.now() < until);
    return { blocked: true };
  }
}

describe.each(PLATFORMS)('the deadline measures Redis, not the app, with default options (%s)', (platform) => {
  let app: INestApplication;
  let port: number;
  const events: RateLimitDecisionEvent[] = [];

  async function start(): Promise<void> {
    @Module({
      imports: [
        RateLimitModule.forRoot({
          redis: await redisUrl(),
          keyPrefix: testPrefix(`app-stall-${platform}`),
          onDecision: (event) => events.push(event),
        }),
      ],
      controllers: [StallController],
    })
    class StallModule {}
    app = await createApp(StallModule, platform, undefined, { trustProxy: true });
    await app.listen(0, '127.0.0.1');
    port = (app.getHttpServer().address() as { port: number }).port;
  }

  afterEach(async () => {
    await app?.close();
    events.length = 0;
  });

  it(`admits at most ${CAPACITY} of 40 requests of a client while a handler blocks the loop ${BLOCK_MS} ms, every one decided by Redis, in 20 rounds`, async () => {
    await start();
    for (let round = 0; round < 20; round++) {
      const ip = `10.20.${round}.1`;
      events.length = 0;
      // 20 limited requests, the blocking one, 20 more: decisions queued before it wait out the stall.
      const requests = Array.from({ length: 40 }, () => ({ path: 'limited', ip }));
      requests.splice(20, 0, { path: 'block', ip: '10.99.99.99' });
      const answers = await burst(port, requests);
      const limited = answers.filter((answer) => answer.path === 'limited');
      const admitted = limited.filter((answer) => answer.status === 200).length;
      expect({ round, admitted, refused: limited.filter((answer) => answer.status === 429).length }).toEqual({
        round,
        admitted: CAPACITY,
        refused: 40 - CAPACITY,
      });
      expect({ round, sources: [...new Set(events.map((event) => event.source))].filter((s) => s !== 'store' && s !== 'cache') }).toEqual({
        round,
        sources: [],
      });
    }
  });

  it(`admits at most ${CAPACITY} of a cold app's first burst of 300, every one decided by Redis`, async () => {
    await start();
    const answers = await burst(
      port,
      Array.from({ length: 300 }, () => ({ path: 'limited', ip: '10.30.0.1' })),
    );
    expect(answers.filter((answer) => answer.status === 200).length).toBe(CAPACITY);
    expect(answers.filter((answer) => answer.status === 429).length).toBe(300 - CAPACITY);
    expect(events.filter((event) => event.source !== 'store' && event.source !== 'cache')).toEqual([]);
  });
});
