import { Controller, Get, Inject, Injectable, Module, Scope } from '@nestjs/common';
import { Test, type TestingModule } from '@nestjs/testing';
import { Paced, RateLimitModule } from 'nest-redis-rate-limit';
import { redisUrl } from '../../support/redis.js';
import { redisScenario } from '../../support/scenario.js';

/**
 * Issue 32, item 5: a `@Paced` method calls the `BucketService` of the application that created its
 * instance, not of the one that started last. Two applications in one process (each with its own key
 * prefix) each write under their own prefix, whichever started last; closing one leaves the other's
 * calls working; a call on an instance of a closed application is refused, not sent to another one.
 * An instance no application created uses the only application that runs, and is refused beside two.
 */
const calls: string[] = [];
/** 10 tokens, one back every 1,000 s: the counts below never see a refill. */
const SLOW = 0.001;

@Injectable()
class PartnerClient {
  @Paced({ name: 'partner', capacity: 10, refillPerSecond: SLOW })
  async fetch(who: string): Promise<string> {
    calls.push(who);
    return `fetched for ${who}`;
  }

  @Paced<[string | undefined]>({ name: (tenant) => tenant as string, capacity: 10, refillPerSecond: SLOW })
  async forTenant(tenant: string | undefined): Promise<string> {
    calls.push(`tenant ${tenant}`);
    return 'ok';
  }
}

/** A transient provider: Nest makes one instance per consumer. */
@Injectable({ scope: Scope.TRANSIENT })
class TransientClient {
  @Paced({ name: 'transient', capacity: 10, refillPerSecond: SLOW })
  async fetch(): Promise<string> {
    return 'transient';
  }
}

@Controller('paced')
class PacedController {
  constructor(@Inject(TransientClient) readonly transient: TransientClient) {}

  /** A @Paced method on a controller. */
  @Get()
  @Paced({ name: 'controller', capacity: 10, refillPerSecond: SLOW })
  async get(): Promise<string> {
    return 'controller';
  }
}

@Module({ providers: [PartnerClient, TransientClient], controllers: [PacedController], exports: [PartnerClient] })
class PartnerModule {}

describe('@Paced uses the application that created its instance', () => {
  const scenario = redisScenario('paced-apps');
  const open: TestingModule[] = [];

  async function start(prefix: string): Promise<TestingModule> {
    const moduleRef = await Test.createTestingModule({
      imports: [RateLimitModule.forRoot({ redis: await redisUrl(), keyPrefix: prefix }), PartnerModule],
    }).compile();
    moduleRef.useLogger(false);
    open.push(moduleRef);
    await moduleRef.init();
    return moduleRef;
  }

  async function close(moduleRef: TestingModule): Promise<void> {
    open.splice(open.indexOf(moduleRef), 1);
    await moduleRef.close();
  }

  /** Tokens left in the bucket `name` under `prefix` (10 when it was never written). */
  async function left(prefix: string, name: string): Promise<number> {
    const tokens = await scenario.client.hget(`${prefix}{${name}}`, 'tokens');
    return tokens === null ? 10 : Math.floor(Number(tokens));
  }

  afterEach(async () => {
    calls.length = 0;
    for (const moduleRef of open.splice(0)) await moduleRef.close();
  });

  it('writes under its own prefix with two applications running, whichever started last, and after the other closed', async () => {
    const [prefixA, prefixB] = [scenario.nextKeyPrefix(), scenario.nextKeyPrefix()];
    const a = await start(prefixA);
    const b = await start(prefixB); // started last
    const clientA = a.get(PartnerClient);
    const clientB = b.get(PartnerClient);
    expect(clientA).not.toBe(clientB);
    expect(await clientA.fetch('a')).toBe('fetched for a');
    expect(await clientA.fetch('a')).toBe('fetched for a');
    expect(await clientB.fetch('b')).toBe('fetched for b');
    expect([await left(prefixA, 'partner'), await left(prefixB, 'partner')]).toEqual([8, 9]);
    // A controller's method and a transient provider's instance are bound to their application too.
    await a.get(PacedController).get();
    await a.get(PacedController).transient.fetch();
    expect([await left(prefixA, 'controller'), await left(prefixB, 'controller')]).toEqual([9, 10]);
    expect([await left(prefixA, 'transient'), await left(prefixB, 'transient')]).toEqual([9, 10]);

    await close(b);
    // A's calls still go to A (they used to reject ERR_RATE_LIMIT_MODULE_NOT_IMPORTED once B closed).
    expect(await clientA.fetch('a')).toBe('fetched for a');
    expect(await left(prefixA, 'partner')).toBe(7);
    expect(calls).toEqual(['a', 'a', 'b', 'a']);
  });

  it("refuses a call on an instance of a closed application, even while another one runs, and the method doesn't run", async () => {
    const [prefixA, prefixC] = [scenario.nextKeyPrefix(), scenario.nextKeyPrefix()];
    const a = await start(prefixA);
    const clientA = a.get(PartnerClient);
    await close(a);
    await start(prefixC);
    await expect(clientA.fetch('late')).rejects.toMatchObject({
      code: 'ERR_RATE_LIMIT_SHUTTING_DOWN',
      message: '@Paced on PartnerClient.fetch: the application that created this instance is closed, so its calls cannot be paced',
    });
    expect(calls).toEqual([]);
    expect(await left(prefixC, 'partner')).toBe(10);
  });

  it('uses the only running application for an instance it did not create, and refuses it beside two', async () => {
    const [prefixA, prefixB] = [scenario.nextKeyPrefix(), scenario.nextKeyPrefix()];
    const made = new PartnerClient();
    await start(prefixA);
    expect(await made.fetch('made')).toBe('fetched for made');
    expect(await left(prefixA, 'partner')).toBe(9);
    await start(prefixB);
    const error = await made.fetch('made').catch((e: unknown) => e);
    expect(error).toMatchObject({ name: 'RateLimitConfigError', code: 'ERR_RATE_LIMIT_PACED_UNBOUND' });
    expect((error as { reason: string }).reason).toBe(
      '@Paced on PartnerClient.fetch: this instance was not created by an application (made with new, request-scoped, ' +
        'or a static method) and 2 applications with RateLimitModule run in this process, so whose limits apply is unknown: ' +
        'make it a provider of the application whose limits it uses',
    );
    expect(calls).toEqual(['made']);
    expect([await left(prefixA, 'partner'), await left(prefixB, 'partner')]).toEqual([9, 10]);
  });

  it('refuses a call whose name function answers no bucket name, and the method does not run', async () => {
    const prefix = scenario.nextKeyPrefix();
    const client = (await start(prefix)).get(PartnerClient);
    await expect(client.forTenant(undefined)).rejects.toMatchObject({
      code: 'ERR_RATE_LIMIT_INVALID_POLICY',
      reason: '@Paced on PartnerClient.forTenant: name answered undefined for this call, not a bucket name (a non-empty string)',
    });
    await expect(client.forTenant('')).rejects.toMatchObject({ code: 'ERR_RATE_LIMIT_INVALID_POLICY' });
    expect(calls).toEqual([]);
    expect(await scenario.client.keys(`${prefix}*`)).toEqual([]);
    expect(await client.forTenant('acme')).toBe('ok');
    expect(await left(prefix, 'acme')).toBe(9);
  });
});
