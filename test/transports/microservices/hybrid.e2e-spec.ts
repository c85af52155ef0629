import { Controller, Get, type INestApplication, Module } from '@nestjs/common';
import { ClientProxyFactory, type ClientProxy, MessagePattern, Payload, Transport } from '@nestjs/microservices';
import { Test } from '@nestjs/testing';
import { Redis } from 'ioredis';
import { RateLimit, type RateLimitDecisionEvent, RateLimitModule } from 'nest-redis-rate-limit';
import { deleteKeys, freePort, keysUnder, redisUrl, testPrefix, tokensOf } from '../../support/redis.js';
import { answers, errors, expectWholeSeconds, RATE_LIMITED, sendAll, times } from './rpc.js';

/**
 * Issue 13 items 3 and 4 in a hybrid app: an HTTP app with a TCP microservice connected by
 * `connectMicroservice()`. Without `inheritAppConfig` the module's global guard does not run on the
 * microservice's handlers; the interceptor the module puts on each limited handler decides them. With
 * it, the guard runs too, and each message is still decided once.
 */
const HOST = '127.0.0.1';

type Job = { tenant: string; n: number };

@Controller('hybrid')
class HybridController {
  @Get('page')
  @RateLimit(2, 0.01)
  page() {
    return 'page';
  }

  @MessagePattern({ cmd: 'burst' })
  @RateLimit({ capacity: 3, refillPerSecond: 0.01, keyBy: (ctx) => ctx.switchToRpc().getData().tenant })
  burst(@Payload() job: Job) {
    return { tenant: job.tenant, n: job.n };
  }

  @MessagePattern({ cmd: 'byIp' })
  @RateLimit(3, 0.01)
  byIp() {
    return 'ok';
  }
}

describe.each([false, true])('@RateLimit in a hybrid app, connectMicroservice() with inheritAppConfig: %s', (inheritAppConfig) => {
  const prefix = testPrefix(`microservices-hybrid-${inheritAppConfig}`);
  const decisions: RateLimitDecisionEvent[] = [];
  let redis: Redis;
  let app: INestApplication | undefined;
  let client: ClientProxy | undefined;

  beforeAll(async () => {
    const url = await redisUrl();
    redis = new Redis(url);
    @Module({
      imports: [RateLimitModule.forRoot({ redis: url, keyPrefix: prefix, onDecision: (event) => decisions.push(event) })],
      controllers: [HybridController],
    })
    class HybridModule {}
    const moduleRef = await Test.createTestingModule({ imports: [HybridModule] }).compile();
    app = moduleRef.createNestApplication({ logger: false });
    const port = await freePort();
    const microservice = { transport: Transport.TCP, options: { host: HOST, port } } as const;
    if (inheritAppConfig) app.connectMicroservice(microservice, { inheritAppConfig: true });
    else app.connectMicroservice(microservice);
    await app.startAllMicroservices();
    await app.listen(0, HOST);
    client = ClientProxyFactory.create({ transport: Transport.TCP, options: { host: HOST, port } });
    await client.connect();
  });

  afterAll(async () => {
    await client?.close();
    await app?.close();
    await deleteKeys(redis, prefix);
    await redis.quit();
  });

  it('10 parallel sends of one tenant: exactly 3 answers, 7 RATE_LIMITED errors, each message decided once', async () => {
    const outcomes = await sendAll(
      client!,
      { cmd: 'burst' },
      times(10, (n: number) => ({ tenant: 'acme', n })),
    );
    expect(answers(outcomes)).toHaveLength(3);
    expect(errors(outcomes)).toEqual(Array(7).fill(RATE_LIMITED));
    for (const error of errors(outcomes)) expectWholeSeconds(error);
    const burst = decisions.filter((d) => d.route === 'HybridController.burst');
    expect(burst.map((d) => d.outcome).sort()).toEqual([...Array(3).fill('allowed'), ...Array(7).fill('denied')]);
    expect(await tokensOf(redis, `${prefix}{id:acme}:HybridController.burst`)).toBeLessThan(0.01);
  });

  it('a per-IP policy (decided before guards) keys by the TCP peer, once per message', async () => {
    const outcomes = await sendAll(client!, { cmd: 'byIp' }, times(8, {}));
    expect(answers(outcomes)).toEqual(['ok', 'ok', 'ok']);
    expect(errors(outcomes)).toEqual(Array(5).fill(RATE_LIMITED));
    expect(decisions.filter((d) => d.route === 'HybridController.byIp')).toHaveLength(8);
    expect((await keysUnder(redis, prefix)).filter((k) => k.endsWith(':HybridController.byIp'))).toEqual([
      `${prefix}{ip:127.0.0.1}:HybridController.byIp`,
    ]);
  });

  it('the HTTP routes of the same app are limited by the global guard as usual', async () => {
    const url = await app!.getUrl();
    const statuses: number[] = [];
    for (let i = 0; i < 3; i++) statuses.push((await fetch(`${url}/hybrid/page`)).status);
    expect(statuses).toEqual([200, 200, 429]);
  });
});
