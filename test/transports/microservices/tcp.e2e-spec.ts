import { Controller, type INestMicroservice, Logger, Module } from '@nestjs/common';
import { ClientProxyFactory, type ClientProxy, EventPattern, MessagePattern, Payload, Transport } from '@nestjs/microservices';
import { Test } from '@nestjs/testing';
import { Redis } from 'ioredis';
import { lastValueFrom } from 'rxjs';
import {
  RateLimit,
  type RateLimitDecisionEvent,
  RateLimitMetricAttributes,
  RateLimitMetricNames,
  RateLimitModule,
  type RateLimitModuleOptions,
} from 'nest-redis-rate-limit';
import { LogRecorder } from '../../support/log-recorder.js';
import { Recorded } from '../../http/metrics/reader.js';
import { deleteKeys, freePort, keysUnder, RedisServer, redisUrl, testPrefix, tokensOf } from '../../support/redis.js';
import { answers, errors, expectWholeSeconds, RATE_LIMITED, sendAll, times, UNAVAILABLE, until } from './rpc.js';

/**
 * Issue 13 item 3 on the TCP transport, with a real microservice and a `ClientProxy`, against the
 * shared Redis: @RateLimit on @MessagePattern (the refusal is the caller's error) and @EventPattern
 * (the refused event is dropped, logged and reported as 'denied'), identities from a keyBy function of
 * the payload and from the TCP peer.
 */
const HOST = '127.0.0.1';
const handled: Record<string, unknown[]> = {};
const note = (name: string, value: unknown) => (handled[name] ??= []).push(value);

type Job = { tenant: string; n: number };

@Controller()
class TcpHandlers {
  @MessagePattern({ cmd: 'burst' })
  @RateLimit({ capacity: 3, refillPerSecond: 0.01, keyBy: (ctx) => ctx.switchToRpc().getData().tenant })
  burst(@Payload() job: Job) {
    note('burst', job);
    return { tenant: job.tenant, n: job.n };
  }

  @MessagePattern({ cmd: 'byIp' })
  @RateLimit(2, 0.01)
  byIp() {
    return 'ok';
  }

  @EventPattern('audit')
  @RateLimit(2, 0.01)
  audit(@Payload() n: number) {
    note('audit', n);
  }
}

@Controller()
class ClosedHandlers {
  @MessagePattern({ cmd: 'ping' })
  @RateLimit({ capacity: 5, refillPerSecond: 0.01, keyBy: (ctx) => ctx.switchToRpc().getData().tenant })
  ping() {
    return 'pong';
  }

  @EventPattern('closed-audit')
  @RateLimit(5, 0.01)
  audit(@Payload() n: number) {
    note('closed-audit', n);
  }
}

interface Running {
  microservice: INestMicroservice;
  client: ClientProxy;
}

/** A TCP microservice on a free loopback port, its limiter configured by `options`, and a client of it. */
async function start(options: RateLimitModuleOptions, controllers: Function[], logs: LogRecorder): Promise<Running> {
  @Module({ imports: [RateLimitModule.forRoot(options)], controllers: controllers as any[] })
  class TcpModule {}
  const moduleRef = await Test.createTestingModule({ imports: [TcpModule] }).compile();
  const port = await freePort();
  const microservice = moduleRef.createNestMicroservice({ transport: Transport.TCP, options: { host: HOST, port }, logger: false });
  // After logger: false (which the testing module applies globally): the recorder hears everything from here on.
  Logger.overrideLogger(logs);
  await microservice.listen();
  const client = ClientProxyFactory.create({ transport: Transport.TCP, options: { host: HOST, port } });
  await client.connect();
  return { microservice, client };
}

async function stop(running: Running | undefined): Promise<void> {
  if (!running) return;
  await running.client.close();
  await running.microservice.close();
}

describe('@RateLimit on a TCP microservice', () => {
  const prefix = testPrefix('microservices-tcp');
  const logs = new LogRecorder();
  const decisions: RateLimitDecisionEvent[] = [];
  const recorded = new Recorded();
  let redis: Redis;
  let running: Running;

  beforeAll(async () => {
    redis = new Redis(await redisUrl());
    running = await start(
      {
        redis: await redisUrl(),
        keyPrefix: prefix,
        onDecision: (event) => decisions.push(event),
        metrics: { meterProvider: recorded.provider },
      },
      [TcpHandlers],
      logs,
    );
  });

  afterAll(async () => {
    await stop(running);
    await recorded.shutdown();
    await deleteKeys(redis, prefix);
    await redis.quit();
    Logger.overrideLogger(false);
  });

  it('10 parallel sends of one tenant: exactly 3 answers, 7 errors with the RATE_LIMITED payload', async () => {
    const outcomes = await sendAll(
      running.client,
      { cmd: 'burst' },
      times(10, (n: number) => ({ tenant: 'acme', n })),
    );
    expect(answers(outcomes)).toHaveLength(3);
    expect(handled.burst).toHaveLength(3);
    for (const answer of answers(outcomes)) expect(answer).toEqual({ tenant: 'acme', n: expect.any(Number) });
    const refused = errors(outcomes);
    expect(refused).toHaveLength(7);
    for (const error of refused) {
      expect(error).toEqual(RATE_LIMITED);
      expectWholeSeconds(error);
    }
    // README "keyBy: whose bucket": {keyPrefix}{id:<value>}:<Controller.handler>.
    const key = `${prefix}{id:acme}:TcpHandlers.burst`;
    expect(await redis.exists(key)).toBe(1);
    expect(await tokensOf(redis, key)).toBeLessThan(0.01);
  });

  it('different tenants get separate buckets: 3 each of interleaved parallel sends', async () => {
    const tenants = ['globex', 'initech'];
    const outcomes = await sendAll(
      running.client,
      { cmd: 'burst' },
      times(12, (n: number) => ({ tenant: tenants[n % 2], n })),
    );
    for (const tenant of tenants) {
      expect(answers(outcomes).filter((a) => (a as Job).tenant === tenant)).toHaveLength(3);
    }
    expect(errors(outcomes)).toEqual(Array(6).fill(RATE_LIMITED));
    expect((await keysUnder(redis, prefix)).filter((k) => k.endsWith(':TcpHandlers.burst'))).toEqual(
      [`${prefix}{id:acme}:TcpHandlers.burst`, `${prefix}{id:globex}:TcpHandlers.burst`, `${prefix}{id:initech}:TcpHandlers.burst`].sort(),
    );
  });

  it("default keyBy 'ip' keys by the TCP peer: {ip:127.0.0.1}", async () => {
    const outcomes = await sendAll(running.client, { cmd: 'byIp' }, times(5, {}));
    expect(answers(outcomes)).toEqual(['ok', 'ok']);
    expect(errors(outcomes)).toEqual(Array(3).fill(RATE_LIMITED));
    expect((await keysUnder(redis, prefix)).filter((k) => k.endsWith(':TcpHandlers.byIp'))).toEqual([
      `${prefix}{ip:127.0.0.1}:TcpHandlers.byIp`,
    ]);
  });

  it('5 events on a bucket of 2: 2 handled, 3 dropped, a warning, and 3 denied decisions (onDecision and metrics)', async () => {
    logs.clear();
    for (let n = 0; n < 5; n++) await lastValueFrom(running.client.emit('audit', n), { defaultValue: undefined });
    const audit = () => decisions.filter((d) => d.route === 'TcpHandlers.audit');
    await until(() => audit().length, 5, 'decisions of TcpHandlers.audit');
    expect(handled.audit).toHaveLength(2);
    expect(
      audit()
        .map((d) => d.outcome)
        .sort(),
    ).toEqual(['allowed', 'allowed', 'denied', 'denied', 'denied']);
    for (const denied of audit().filter((d) => d.outcome === 'denied')) {
      expect(denied).toMatchObject({ scope: 'TcpHandlers.audit', source: 'store', limit: 2, remaining: 0, retryAfterSeconds: 100 });
      expect(denied.context.getType()).toBe('rpc');
    }
    // Throttled: the first drop is said, the next ones are held back (at most one line per 10 s).
    expect(logs.of('RateLimit', 'warn')).toEqual(['Event of TcpHandlers.audit dropped: rate limited (retry after 100 s)']);
    // Dropped without Nest's error log.
    expect(logs.lines.filter((l) => l.level === 'error')).toEqual([]);
    const counts = await recorded.counts(RateLimitMetricNames.decisions);
    const scope = RateLimitMetricAttributes.scope;
    expect(counts.filter((c) => c.attributes[scope] === 'TcpHandlers.audit')).toEqual([
      {
        attributes: {
          [scope]: 'TcpHandlers.audit',
          [RateLimitMetricAttributes.outcome]: 'allowed',
          [RateLimitMetricAttributes.source]: 'store',
        },
        value: 2,
      },
      {
        attributes: {
          [scope]: 'TcpHandlers.audit',
          [RateLimitMetricAttributes.outcome]: 'denied',
          [RateLimitMetricAttributes.source]: 'store',
        },
        value: 3,
      },
    ]);
  });

  it("failureMode 'closed' with its Redis stopped: the caller's error is RATE_LIMIT_UNAVAILABLE, an event is dropped", async () => {
    const server = await RedisServer.start();
    const closedDecisions: RateLimitDecisionEvent[] = [];
    let closed: Running | undefined;
    try {
      closed = await start(
        { redis: server.url, failureMode: 'closed', timeoutMs: 100, onDecision: (event) => closedDecisions.push(event) },
        [ClosedHandlers],
        logs,
      );
      expect(answers(await sendAll(closed.client, { cmd: 'ping' }, [{ tenant: 'acme' }]))).toEqual(['pong']);
      await server.stop();
      const outcomes = await sendAll(closed.client, { cmd: 'ping' }, times(3, { tenant: 'acme' }));
      expect(errors(outcomes)).toEqual(Array(3).fill(UNAVAILABLE));
      expectWholeSeconds(errors(outcomes)[0]);
      // An event is dropped the same way: not handled, reported 'denied' by the 'closed' source.
      for (let n = 0; n < 2; n++) await lastValueFrom(closed.client.emit('closed-audit', n), { defaultValue: undefined });
      const dropped = () => closedDecisions.filter((d) => d.route === 'ClosedHandlers.audit');
      await until(() => dropped().length, 2, 'decisions of ClosedHandlers.audit');
      expect(dropped().map((d) => [d.outcome, d.source])).toEqual([
        ['denied', 'closed'],
        ['denied', 'closed'],
      ]);
      expect(handled['closed-audit']).toBeUndefined();
      expect(logs.lines.filter((l) => l.level === 'error')).toEqual([]);
      // And said: one warning for the two (throttled per handler).
      expect(logs.of('RateLimit', 'warn').filter((line) => line.startsWith('Event of ClosedHandlers.audit dropped'))).toEqual([
        "Event of ClosedHandlers.audit dropped: rate limiting is unavailable (failureMode 'closed')",
      ]);
    } finally {
      await stop(closed);
      await server.stop();
    }
  });
});
