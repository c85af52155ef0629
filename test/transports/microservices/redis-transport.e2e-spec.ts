import { Controller, type INestMicroservice, Logger, Module } from '@nestjs/common';
import { ClientProxyFactory, type ClientProxy, EventPattern, MessagePattern, Payload, Transport } from '@nestjs/microservices';
import { Test } from '@nestjs/testing';
import { Redis } from 'ioredis';
import { lastValueFrom } from 'rxjs';
import { RateLimit, type RateLimitDecisionEvent, RateLimitModule } from 'nest-redis-rate-limit';
import { LogRecorder } from '../../support/log-recorder.js';
import { deleteKeys, keysUnder, redisUrl, testPrefix, tokensOf } from '../../support/redis.js';
import { answers, errors, expectWholeSeconds, RATE_LIMITED, sendAll, times, until } from './rpc.js';

/**
 * Issue 13 item 3 on the Redis transport: the microservice and its `ClientProxy` talk through the
 * shared Redis (pub/sub channels named by the patterns, so each run's patterns carry its own prefix)
 * and the limiter keeps its buckets there too. No peer address on this transport: identities come
 * from a keyBy function of the payload; a per-IP policy shares one bucket, `ip:unknown` (README).
 */
const prefix = testPrefix('microservices-redis');
const BURST = `${prefix}burst`;
const BY_IP = `${prefix}by-ip`;
const AUDIT = `${prefix}audit`;
const handled: Record<string, unknown[]> = {};
const note = (name: string, value: unknown) => (handled[name] ??= []).push(value);

type Job = { tenant: string; n: number };

@Controller()
class RedisHandlers {
  @MessagePattern(BURST)
  @RateLimit({ capacity: 3, refillPerSecond: 0.01, keyBy: (ctx) => ctx.switchToRpc().getData().tenant })
  burst(@Payload() job: Job) {
    note('burst', job);
    return { tenant: job.tenant, n: job.n };
  }

  @MessagePattern(BY_IP)
  @RateLimit(2, 0.01)
  byIp() {
    return 'ok';
  }

  @EventPattern(AUDIT)
  @RateLimit(2, 0.01)
  audit(@Payload() n: unknown) {
    note('audit', n);
  }
}

/** The transport's connection options for the shared Redis. */
function transportOptions(url: string): { host: string; port: number; password?: string; username?: string } {
  const parsed = new URL(url);
  return {
    host: parsed.hostname,
    port: Number(parsed.port || 6379),
    ...(parsed.password ? { password: decodeURIComponent(parsed.password) } : {}),
    ...(parsed.username ? { username: decodeURIComponent(parsed.username) } : {}),
  };
}

describe('@RateLimit on a Redis-transport microservice', () => {
  const logs = new LogRecorder();
  const decisions: RateLimitDecisionEvent[] = [];
  let redis: Redis;
  let microservice: INestMicroservice | undefined;
  let client: ClientProxy | undefined;

  beforeAll(async () => {
    const url = await redisUrl();
    redis = new Redis(url);
    @Module({
      imports: [RateLimitModule.forRoot({ redis: url, keyPrefix: prefix, onDecision: (event) => decisions.push(event) })],
      controllers: [RedisHandlers],
    })
    class RedisTransportModule {}
    const moduleRef = await Test.createTestingModule({ imports: [RedisTransportModule] }).compile();
    microservice = moduleRef.createNestMicroservice({ transport: Transport.REDIS, options: transportOptions(url), logger: false });
    Logger.overrideLogger(logs);
    await microservice.listen();
    client = ClientProxyFactory.create({ transport: Transport.REDIS, options: transportOptions(url) });
    await client.connect();
  });

  afterAll(async () => {
    await client?.close();
    await microservice?.close();
    await deleteKeys(redis, prefix);
    await redis.quit();
    Logger.overrideLogger(false);
  });

  it('10 parallel sends of one tenant: exactly 3 answers, 7 errors with the RATE_LIMITED payload', async () => {
    const outcomes = await sendAll(
      client!,
      BURST,
      times(10, (n: number) => ({ tenant: 'acme', n })),
    );
    expect(answers(outcomes)).toHaveLength(3);
    expect(handled.burst).toHaveLength(3);
    for (const answer of answers(outcomes)) expect(answer).toEqual({ tenant: 'acme', n: expect.any(Number) });
    const refused = errors(outcomes);
    expect(refused).toEqual(Array(7).fill(RATE_LIMITED));
    for (const error of refused) expectWholeSeconds(error);
    const key = `${prefix}{id:acme}:RedisHandlers.burst`;
    expect(await redis.exists(key)).toBe(1);
    expect(await tokensOf(redis, key)).toBeLessThan(0.01);
  });

  it('different tenants get separate buckets: 3 each of interleaved parallel sends', async () => {
    const tenants = ['globex', 'initech'];
    const outcomes = await sendAll(
      client!,
      BURST,
      times(12, (n: number) => ({ tenant: tenants[n % 2], n })),
    );
    for (const tenant of tenants) expect(answers(outcomes).filter((a) => (a as Job).tenant === tenant)).toHaveLength(3);
    expect(errors(outcomes)).toEqual(Array(6).fill(RATE_LIMITED));
    expect((await keysUnder(redis, prefix)).filter((k) => k.endsWith(':RedisHandlers.burst'))).toEqual(
      [
        `${prefix}{id:acme}:RedisHandlers.burst`,
        `${prefix}{id:globex}:RedisHandlers.burst`,
        `${prefix}{id:initech}:RedisHandlers.burst`,
      ].sort(),
    );
  });

  it('a per-IP policy has no peer to read: every caller shares the bucket {ip:unknown}, as documented', async () => {
    const outcomes = await sendAll(client!, BY_IP, times(5, {}));
    expect(answers(outcomes)).toEqual(['ok', 'ok']);
    expect(errors(outcomes)).toEqual(Array(3).fill(RATE_LIMITED));
    expect((await keysUnder(redis, prefix)).filter((k) => k.endsWith(':RedisHandlers.byIp'))).toEqual([
      `${prefix}{ip:unknown}:RedisHandlers.byIp`,
    ]);
  });

  it('5 events on a bucket of 2: 2 handled, 3 dropped with a warning and 3 denied decisions', async () => {
    logs.clear();
    for (let n = 0; n < 5; n++) await lastValueFrom(client!.emit(AUDIT, n), { defaultValue: undefined });
    const audit = () => decisions.filter((d) => d.route === 'RedisHandlers.audit');
    await until(() => audit().length, 5, 'decisions of RedisHandlers.audit');
    expect(handled.audit).toHaveLength(2);
    expect(
      audit()
        .map((d) => d.outcome)
        .sort(),
    ).toEqual(['allowed', 'allowed', 'denied', 'denied', 'denied']);
    expect(logs.of('RateLimit', 'warn')).toEqual(['Event of RedisHandlers.audit dropped: rate limited (retry after 100 s)']);
    expect(logs.lines.filter((l) => l.level === 'error')).toEqual([]);
  });
});
