import { type INestApplication, Module } from '@nestjs/common';
import { RateLimitModule, type RateLimitDecisionEvent } from 'nest-redis-rate-limit';
import { createApp } from '../../support/app.js';
import { burst } from '../../support/burst.js';
import { stallController } from '../../support/stall-app.js';
import { LogRecorder } from '../../support/log-recorder.js';
import { testPrefix } from '../../support/redis.js';
import { LocalSentinels } from '../../support/sentinel.js';

/**
 * The app's own stall must not make a healthy master look dead (docs/guides/redis-sentinel.md, "Why
 * not socketTimeout"). An app with the module's own Sentinel client and the default options; a handler
 * holds the event loop for BLOCK_MS, longer than the 1 s within which a connection that sends nothing
 * back is dropped, while decisions of other clients are in flight (a burst from another process). Their
 * replies are waiting in the socket when the loop comes back: every decision is Redis', exactly
 * CAPACITY admissions per client, and the connection to the master is the same one throughout.
 */
const CAPACITY = 5;
const BLOCK_MS = 1500;
const ROUNDS = 3;

const StallController = stallController(CAPACITY, BLOCK_MS);

describe('Sentinel: a stall of the app is not a dead master', () => {
  let deployment: LocalSentinels | undefined;
  let app: INestApplication | undefined;
  const events: RateLimitDecisionEvent[] = [];
  const recorder = new LogRecorder();

  afterAll(async () => {
    await app?.close();
    await deployment?.stop();
  });

  it(`keeps its connection and decides every request on Redis while a handler holds the loop ${BLOCK_MS} ms, ${ROUNDS} rounds`, async () => {
    // No failover here: the sentinels only have to name the master.
    deployment = await LocalSentinels.start({ failover: false });
    const d = deployment;
    @Module({
      imports: [
        RateLimitModule.forRoot({
          redis: d.options,
          keyPrefix: testPrefix('sentinel-app-stall'),
          onDecision: (event) => events.push(event),
        }),
      ],
      controllers: [StallController],
    })
    class StallModule {}
    app = await createApp(StallModule, 'express', (a) => a.useLogger(recorder), { trustProxy: true });
    await app.listen(0, '127.0.0.1');
    const port = (app.getHttpServer().address() as { port: number }).port;
    // Connections the master accepted: the app's own is opened once, at start, and never again.
    const connections = () => d.ask(d.master.port, async (c) => Number(/total_connections_received:(\d+)/.exec(await c.info('stats'))![1]));
    const before = await connections();

    for (let round = 0; round < ROUNDS; round++) {
      const ip = `10.24.${round}.1`;
      events.length = 0;
      // 20 limited requests, the blocking one, 20 more: the decisions of the first are in flight during the stall.
      const requests = Array.from({ length: 40 }, () => ({ path: 'limited', ip }));
      requests.splice(20, 0, { path: 'block', ip: '10.99.99.99' });
      const answers = (await burst(port, requests)).filter((answer) => answer.path === 'limited');
      expect({
        round,
        admitted: answers.filter((answer) => answer.status === 200).length,
        refused: answers.filter((answer) => answer.status === 429).length,
        sources: [...new Set(events.map((event) => event.source))].filter((s) => s !== 'store' && s !== 'cache'),
      }).toEqual({ round, admitted: CAPACITY, refused: 40 - CAPACITY, sources: [] });
    }

    // One more: the one `connections()` itself opened.
    expect((await connections()) - before).toBe(1);
    expect(recorder.lines.filter((line) => line.level !== 'log' && line.context === 'RateLimit')).toEqual([]);
  }, 15_000);
});
