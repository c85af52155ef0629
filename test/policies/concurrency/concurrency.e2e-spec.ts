import { type INestApplication, Module } from '@nestjs/common';
import { get } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Redis } from 'ioredis';
import request from 'supertest';
import { RateLimitMetricNames, RateLimitModule, type RateLimitDecisionEvent } from 'nest-redis-rate-limit';
import { Recorded } from '../../http/metrics/reader.js';
import { createApp } from '../../support/app.js';
import { redisUrl } from '../../support/redis.js';
import { redisScenario } from '../../support/scenario.js';
import { ConcurrencyController, gates } from './concurrency.controller.js';

/**
 * @ConcurrencyLimit over HTTP (issue 36, item 1): a request is admitted while fewer than `limit` of its
 * identity are in flight, is told the limit and the slots in use, and gives its slot back however its
 * response ends (returned, thrown, 4xx, a client gone, a streamed body, server-sent events). Redis and
 * the memory store alike; on Redis, nothing is left under the prefix once every request is done.
 */
describe('@ConcurrencyLimit over HTTP', () => {
  const scenario = redisScenario('concurrency', { restoreLogger: true });
  let redis: Redis;
  let keyPrefix: string;

  beforeAll(async () => {
    redis = new Redis(await redisUrl());
  });
  afterAll(async () => {
    await redis.quit();
  });
  afterEach(() => gates.openAll());

  async function start(store: 'redis' | 'memory', watch: Record<string, unknown> = {}): Promise<INestApplication> {
    keyPrefix = scenario.nextKeyPrefix();
    const url = await redisUrl();
    @Module({
      imports: [
        RateLimitModule.forRoot(store === 'redis' ? { redis: url, keyPrefix, ...watch } : { store: 'memory', keyPrefix, ...watch }),
      ],
      controllers: [ConcurrencyController],
    })
    class ConcurrencyModule {}
    const app = scenario.track(await createApp(ConcurrencyModule, 'express'));
    await app.listen(0, '127.0.0.1');
    return app;
  }

  function port(app: INestApplication): number {
    return (app.getHttpServer().address() as AddressInfo).port;
  }

  /** Sends a request now; resolves with its status and concurrency headers once it ends. */
  function send(app: INestApplication, path: string): Promise<string> {
    return request(app.getHttpServer())
      .get(path)
      .then(
        (r) =>
          `${r.status} limit=${r.headers['concurrency-limit']} inFlight=${r.headers['concurrency-in-flight']} retry=${r.headers['retry-after'] ?? '-'}`,
      );
  }

  /** The slot keys left under the test's prefix, with their fields. */
  async function slotsLeft(): Promise<string[]> {
    const keys = await redis.keys(`${keyPrefix}*`);
    return keys.filter((key) => key.includes('}!'));
  }

  async function eventually(check: () => Promise<boolean>, what: string): Promise<void> {
    for (let i = 0; i < 200; i++) {
      if (await check()) return;
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    const left = await slotsLeft();
    throw new Error(`never: ${what} (${JSON.stringify(await Promise.all(left.map(async (k) => [k, await redis.hgetall(k)])))})`);
  }

  describe.each(['redis', 'memory'] as const)('store %s', (store) => {
    it('admits 2 in flight, refuses the third with the limit, the slots in use and a Retry-After hint, and admits again once one ends', async () => {
      const app = await start(store);
      const first = send(app, `/conc/hold/${store}-a/ok`);
      const second = send(app, `/conc/hold/${store}-b/ok`);
      await gates.waitingFor(2);
      expect(await send(app, `/conc/hold/${store}-c/ok`)).toBe('429 limit=2 inFlight=2 retry=1');
      gates.open(`${store}-a`);
      expect(await first).toBe('200 limit=2 inFlight=1 retry=-');
      gates.open(`${store}-d`);
      expect(await send(app, `/conc/hold/${store}-d/ok`)).toBe('200 limit=2 inFlight=2 retry=-');
      gates.open(`${store}-b`);
      expect(await second).toMatch(/^200 limit=2 inFlight=2 /);
      if (store === 'redis') expect(await slotsLeft()).toEqual([]);
    });

    it('gives the slot back when the handler throws, answers 400, or its client disconnects', async () => {
      const app = await start(store);
      gates.open(`${store}-t`);
      gates.open(`${store}-4`);
      expect(await send(app, `/conc/hold/${store}-t/throw`)).toMatch(/^500 /);
      expect(await send(app, `/conc/hold/${store}-4/400`)).toMatch(/^400 /);
      // Two clients that leave while their handlers wait: the slots go back when the handlers end.
      const gone = [`${store}-x`, `${store}-y`].map((id) => {
        const req = get({ host: '127.0.0.1', port: port(app), path: `/conc/hold/${id}/ok` });
        req.on('error', () => undefined);
        return req;
      });
      await gates.waitingFor(2);
      gone.forEach((req) => req.destroy());
      expect(await send(app, `/conc/hold/${store}-z/ok`)).toMatch(/^429 /);
      gates.open(`${store}-x`);
      gates.open(`${store}-y`);
      gates.open(`${store}-z2`);
      gates.open(`${store}-z3`);
      await eventually(async () => (await send(app, `/conc/hold/${store}-z2/ok`)).startsWith('200'), 'a slot free again');
      expect([await send(app, `/conc/hold/${store}-z3/ok`)]).toEqual([expect.stringMatching(/^200 /)]);
      if (store === 'redis') await eventually(async () => (await slotsLeft()).length === 0, 'no slot left in Redis');
    });

    it("holds a streamed body's slot until it is sent, and an SSE stream's until it ends or its client leaves", async () => {
      const app = await start(store);
      const file = send(app, `/conc/file/${store}-f`);
      await gates.waitingFor(1);
      expect(await send(app, `/conc/file/${store}-f2`)).toMatch(/^429 limit=1 inFlight=1 /);
      gates.open(`${store}-f`);
      expect(await file).toMatch(/^200 /);
      gates.open(`${store}-f3`);
      await eventually(async () => (await send(app, `/conc/file/${store}-f3`)).startsWith('200'), 'the file slot free');

      // An SSE client that leaves frees the slot though the stream never completed.
      const sse = get({ host: '127.0.0.1', port: port(app), path: `/conc/events/${store}-e` });
      sse.on('error', () => undefined);
      const firstEvent = new Promise<void>((resolve) => sse.on('response', (res) => res.once('data', () => resolve())));
      await firstEvent;
      // Nest may commit an SSE response's headers before the interceptors have answered: a refusal is then
      // the stream's error event rather than a 429 (docs/guides/concurrency.md); the handler never runs.
      const refused = await new Promise<string>((resolve) =>
        get({ host: '127.0.0.1', port: port(app), path: `/conc/events/${store}-e2` }, (res) => {
          let body = '';
          res.on('data', (chunk) => (body += String(chunk)));
          res.on('end', () => resolve(body));
        }),
      );
      expect(refused).toMatch(/"statusCode":429|^event: error/m);
      expect(refused).not.toMatch(/first/);
      sse.destroy();
      gates.open(`${store}-e3`);
      // Admitted means the handler ran and sent its first event (a refusal is an error event, status 200 or not).
      await eventually(
        () =>
          new Promise<boolean>((resolve) =>
            get({ host: '127.0.0.1', port: port(app), path: `/conc/events/${store}-e3` }, (res) => {
              let body = '';
              res.on('data', (chunk) => {
                body += String(chunk);
                if (/data: first|event: error|statusCode/.test(body)) {
                  resolve(body.includes('data: first'));
                  res.destroy();
                }
              });
              res.on('end', () => resolve(body.includes('data: first')));
            }),
          ),
        'the SSE slot free after its client left',
      );
      gates.open(`${store}-e`);
      gates.open(`${store}-e2`);
      if (store === 'redis') await eventually(async () => (await slotsLeft()).length === 0, 'no slot left in Redis');
    });

    it('waits up to maxWaitMs for a slot: the slot a finished request gives back goes to the first waiter', async () => {
      const app = await start(store);
      const held = [send(app, `/conc/queue/${store}-q1`), send(app, `/conc/queue/${store}-q2`)];
      await gates.waitingFor(2);
      const waiter = send(app, `/conc/queue/${store}-q3`);
      await new Promise((resolve) => setTimeout(resolve, 100));
      expect(gates.inFlight).toBe(2);
      gates.open(`${store}-q1`);
      await held[0];
      await gates.waitingFor(2);
      gates.open(`${store}-q2`);
      gates.open(`${store}-q3`);
      expect(await waiter).toMatch(/^200 /);
      expect(await held[1]).toMatch(/^200 /);
      if (store === 'redis') await eventually(async () => (await slotsLeft()).length === 0, 'no slot left in Redis');
    });

    it.each([
      ['both', 'in two calls'],
      ['together', 'in one call'],
    ])('takes no rate token for a request refused for its slot: /conc/%s, rate and slot %s', async (route) => {
      const app = await start(store);
      const holder = send(app, `/conc/${route}/${store}-b1`);
      await gates.waitingFor(1);
      // Four refused for the slot: with their tokens kept, the bucket of 5 would be empty now.
      for (let i = 0; i < 4; i++) expect(await send(app, `/conc/${route}/${store}-bx`)).toMatch(/^429 limit=1 inFlight=1 /);
      gates.open(`${store}-b1`);
      await holder;
      gates.open(`${store}-b2`);
      const remaining = await request(app.getHttpServer())
        .get(`/conc/${route}/${store}-b2`)
        .then((r) => r.headers['x-ratelimit-remaining']);
      expect(remaining).toBe('3');
    });
  });

  it('gives back the rate token of a client that leaves while it waits for a slot', async () => {
    const app = await start('redis');
    const holder = send(app, '/conc/both-wait/bw1');
    await gates.waitingFor(1);
    const leaving = get({ host: '127.0.0.1', port: port(app), path: '/conc/both-wait/bw2' });
    leaving.on('error', () => undefined);
    // Its rate token is taken by now (the guard decided), and it waits for the slot.
    await new Promise((resolve) => setTimeout(resolve, 150));
    leaving.destroy();
    await new Promise((resolve) => setTimeout(resolve, 150));
    gates.open('bw1');
    await holder;
    gates.open('bw3');
    const remaining = await request(app.getHttpServer())
      .get('/conc/both-wait/bw3')
      .then((r) => r.headers['x-ratelimit-remaining']);
    // 5 - bw1 - bw3: bw2 ran nothing and took nothing.
    expect(remaining).toBe('3');
    expect(gates.most).toBe(1);
  });

  it('gives up the wait of a request an app timeout ended: the slot freed later is not taken for nobody', async () => {
    const app = await start('redis');
    const holder = send(app, '/conc/timed/hold-1');
    await gates.waitingFor(1);
    // Waits for the slot (maxWaitMs 3 s), and the app's timeout around the route ends it after 300 ms.
    expect(await send(app, '/conc/timed/short-2')).toMatch(/^500 /);
    gates.open('hold-1');
    await holder;
    // short-2 never ran, and holds nothing: the slot key goes once hold-1's slot is back.
    await eventually(async () => (await slotsLeft()).length === 0, 'no slot left for the timed-out request');
    await new Promise((resolve) => setTimeout(resolve, 200));
    expect(await slotsLeft()).toEqual([]);
    expect(gates.entered.filter((id) => id === 'hold-1' || id === 'short-2')).toEqual(['hold-1']);
  });

  it('reports each slot decision to onDecision and the metrics, apart from the rate decisions, and the slots held now', async () => {
    const events: RateLimitDecisionEvent[] = [];
    const recorded = new Recorded();
    const app = await start('redis', {
      onDecision: (event: RateLimitDecisionEvent) => events.push(event),
      metrics: { meterProvider: recorded.provider },
    });
    try {
      const held = send(app, '/conc/both/m1');
      await gates.waitingFor(1);
      expect(await recorded.points(RateLimitMetricNames.concurrencyHeld)).toEqual([expect.objectContaining({ value: 1 })]);
      expect(await send(app, '/conc/both/m2')).toMatch(/^429 /);
      gates.open('m1');
      await held;
      const slots = events.filter((event) => event.limiter === 'concurrency');
      expect(slots.map(({ scope, outcome, source, limit, remaining }) => ({ scope, outcome, source, limit, remaining }))).toEqual([
        { scope: 'both', outcome: 'allowed', source: 'store', limit: 1, remaining: 0 },
        { scope: 'both', outcome: 'denied', source: 'store', limit: 1, remaining: 0 },
      ]);
      // The rate policy's decisions are reported as before, without `limiter`.
      expect(events.filter((event) => event.limiter === undefined).map((event) => event.outcome)).toEqual(['allowed', 'allowed']);
      const scope = 'ratelimit.scope';
      expect(await recorded.counts(RateLimitMetricNames.concurrencyDecisions)).toEqual([
        { attributes: { [scope]: 'both', 'ratelimit.outcome': 'allowed', 'ratelimit.source': 'store' }, value: 1 },
        { attributes: { [scope]: 'both', 'ratelimit.outcome': 'denied', 'ratelimit.source': 'store' }, value: 1 },
      ]);
      expect((await recorded.counts(RateLimitMetricNames.decisions)).map((c) => c.value)).toEqual([2]);
      expect(await recorded.points(RateLimitMetricNames.concurrencyHeld)).toEqual([expect.objectContaining({ value: 0 })]);
    } finally {
      await recorded.shutdown();
    }
  });
});
