import { type INestApplication, Module } from '@nestjs/common';
import { BucketService, RateLimitModule, type RateLimitDecisionEvent } from 'nest-redis-rate-limit';
import { createApp, PLATFORMS } from '../../support/app.js';
import { burst, bursts } from '../../support/burst.js';
import { stallController } from '../../support/stall-app.js';
import { redisUrl, testPrefix } from '../../support/redis.js';
// Not public: the store-call events the metrics' store-duration histogram is recorded from.
import { RateLimitEvents, type StoreCallEvent } from '../../../libs/rate-limit/src/events/rate-limit-events.js';

/**
 * The deadline measures Redis, not the app (issue 20 item 1). With the default options
 * (failureMode 'local', timeoutMs 100) and a healthy Redis, time in which the app's own event loop
 * could not run must never become a timeout, a breaker trip or an admission without a decision.
 */
const CAPACITY = 5;
const BLOCK_MS = 300;

const StallController = stallController(CAPACITY, BLOCK_MS);

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
    // 20 limited requests of the round's client, the blocking one, 20 more: decisions queued before it wait
    // out the stall. One burst after the other from one client process (a process each took 150 ms more).
    const ipOf = (round: number) => `10.20.${round}.1`;
    const rounds = Array.from({ length: 20 }, (_, round) => {
      const requests = Array.from({ length: 40 }, () => ({ path: 'limited', ip: ipOf(round) }));
      requests.splice(20, 0, { path: 'block', ip: '10.99.99.99' });
      return requests;
    });
    const answered = await bursts(port, rounds);
    // Each decision's round, by its client's address (the burst's X-Forwarded-For).
    const clientOf = (event: RateLimitDecisionEvent) =>
      event.context.switchToHttp().getRequest<{ headers: Record<string, unknown> }>().headers['x-forwarded-for'];
    for (let round = 0; round < 20; round++) {
      const limited = answered[round].filter((answer) => answer.path === 'limited');
      const decided = events.filter((event) => clientOf(event) === ipOf(round));
      expect({ round, decided: decided.length }).toEqual({ round, decided: 40 });
      // First whether failureMode decided any (a call that timed out: its in-process bucket admits on its
      // own), so that a failure says which promise broke: the deadline's, or the count's.
      expect({ round, sources: [...new Set(decided.map((event) => event.source))].filter((s) => s !== 'store' && s !== 'cache') }).toEqual({
        round,
        sources: [],
      });
      const admitted = limited.filter((answer) => answer.status === 200).length;
      expect({ round, admitted, refused: limited.filter((answer) => answer.status === 429).length }).toEqual({
        round,
        admitted: CAPACITY,
        refused: 40 - CAPACITY,
      });
    }
    expect(events.filter((event) => event.source !== 'store' && event.source !== 'cache')).toEqual([]);
    // On a loaded machine the 20 rounds outlast jest's 30 s.
  }, 120_000);

  it('reports store latency from the write: of 10 decisions asked for before a 300 ms stall, only the one written before it counts it', async () => {
    await start();
    const calls: StoreCallEvent[] = [];
    app.get(RateLimitEvents).onStoreCall((event) => calls.push(event));
    const buckets = app.get(BucketService);
    // One turn: the first decision is written at once, the other 9 wait for the turn's shared call; then
    // the app holds the loop. Redis answers in a few ms, but only after the stall can the app read it.
    const decisions = Array.from({ length: 10 }, (_, i) => buckets.consume(`stall-${platform}-${i}`, { capacity: 1, refillPerSecond: 1 }));
    const until = performance.now() + BLOCK_MS;
    while (performance.now() < until);
    expect((await Promise.all(decisions)).map((decision) => decision.allowed)).toEqual(Array(10).fill(true));
    expect(calls.map((call) => call.outcome)).toEqual(Array(10).fill('ok'));
    // Before the fix, all 10 counted the stall (their clocks started when they were asked for).
    // The other 9 did not count it: each under BLOCK_MS (a few ms on a quiet machine; below BLOCK_MS / 2 was a
    // guess at how slow a loaded one may be, a bound on speed where only the stall is in question).
    expect(calls.filter((call) => call.durationMs >= BLOCK_MS).length).toBe(1);
    expect(calls.filter((call) => call.durationMs < BLOCK_MS).length).toBe(9);
  });

  it(`admits at most ${CAPACITY} of a cold app's first burst of 300, every one decided by Redis`, async () => {
    await start();
    const answers = await burst(
      port,
      Array.from({ length: 300 }, () => ({ path: 'limited', ip: '10.30.0.1' })),
    );
    expect(events.filter((event) => event.source !== 'store' && event.source !== 'cache')).toEqual([]);
    expect(answers.filter((answer) => answer.status === 200).length).toBe(CAPACITY);
    expect(answers.filter((answer) => answer.status === 429).length).toBe(300 - CAPACITY);
  });
});
