import { Body, Controller, type ExecutionContext, Injectable, Module, Post } from '@nestjs/common';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { RateLimit, RateLimitModule, type RateLimitResolver, type ResolvedLimits } from 'nest-redis-rate-limit';
import { RouteLimiter } from '../../../libs/rate-limit/src/pipeline/route-limiter.js';
import { createApp } from '../../support/app.js';
import { redisUrl } from '../../support/redis.js';
import { redisScenario } from '../../support/scenario.js';

/**
 * Issue 22, finding 1: the resolver cache holds, per identity, a bounded key (the bucket key's identity,
 * a digest for a long one) and the answer, never the raw identity; an answer older than
 * `resolverCacheMs` is asked again and its entry is gone.
 */
@Injectable()
class TenantLimits implements RateLimitResolver {
  lookups = 0;
  resolve(): ResolvedLimits {
    this.lookups++;
    return { capacity: 5, refillPerSecond: 1 };
  }
}

const tenantOf = (context: ExecutionContext): string => context.switchToHttp().getRequest().body.tenant;

@Controller('tenants')
class TenantsController {
  @Post()
  @RateLimit({ resolve: TenantLimits, keyBy: tenantOf })
  post(@Body() _body: unknown) {
    return { ok: true };
  }
}

/** Fails the lookups it is told to (a throw, then a rejected promise), then answers 5 per 5 s. */
@Injectable()
class FlakyLimits implements RateLimitResolver {
  lookups = 0;
  failures: ('throw' | 'reject')[] = [];
  resolve(): ResolvedLimits | Promise<ResolvedLimits> {
    this.lookups++;
    const failure = this.failures.shift();
    if (failure === 'throw') throw new Error('plan service down');
    if (failure === 'reject') return Promise.reject(new Error('plan service timed out'));
    return { capacity: 5, refillPerSecond: 1 };
  }
}

@Controller('plans')
class PlansController {
  // No fallback: a failed lookup refuses the request with 500, so each response says which lookup it had.
  @Post()
  @RateLimit({ resolve: FlakyLimits, keyBy: tenantOf })
  post(@Body() _body: unknown) {
    return { ok: true };
  }
}

describe('the resolver cache', () => {
  const scenario = redisScenario('resolver-cache');

  async function start(resolverCacheMs: number) {
    @Module({
      imports: [RateLimitModule.forRoot({ redis: await redisUrl(), keyPrefix: scenario.nextKeyPrefix(), resolverCacheMs })],
      controllers: [TenantsController],
      providers: [TenantLimits],
    })
    class ResolverCacheModule {}
    const app = await createApp(ResolverCacheModule, 'express');
    scenario.track(app);
    await app.listen(0, '127.0.0.1');
    const url = await app.getUrl();
    const numbers = (app.get(RouteLimiter) as unknown as { numbers: { cached: number; cache: Map<string, unknown> } }).numbers;
    const cached = () => numbers.cached;
    const forget = () => numbers.cache.clear();
    // fetch keeps its connections open: 2,000 requests take a second, not the ten of a connection each.
    const post = async (tenant: string) => {
      const response = await fetch(`${url}/tenants`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ tenant }),
      });
      await response.arrayBuffer();
      if (response.status !== 201) throw new Error(`POST /tenants answered ${response.status}`);
    };
    return { app, resolver: app.get(TenantLimits), cached, forget, post };
  }

  it('asks the resolver again once resolverCacheMs has passed, and drops the expired entries of other identities', async () => {
    const cacheMs = 300;
    const { resolver, cached, post } = await start(cacheMs);
    for (let i = 0; i < 20; i++) await post(`tenant-${i}`);
    expect(resolver.lookups).toBe(20);
    // Waiting longer (a loaded machine) only makes every entry more expired.
    await new Promise((resolve) => setTimeout(resolve, cacheMs + 100));
    await post('tenant-0');
    expect(resolver.lookups).toBe(21);
    // The 19 others expired too, and nobody asked for them again: they are gone, not kept until 10,000.
    expect(cached()).toBe(1);
  });

  it('does not keep a failed lookup for resolverCacheMs: the next request of the identity asks again, and a success is kept', async () => {
    @Module({
      imports: [RateLimitModule.forRoot({ redis: await redisUrl(), keyPrefix: scenario.nextKeyPrefix(), resolverCacheMs: 600_000 })],
      controllers: [PlansController],
      providers: [FlakyLimits],
    })
    class FlakyResolverModule {}
    const app = scenario.track(await createApp(FlakyResolverModule, 'express'));
    await app.listen(0, '127.0.0.1');
    const url = await app.getUrl();
    const resolver = app.get(FlakyLimits);
    const numbers = (app.get(RouteLimiter) as unknown as { numbers: { cached: number } }).numbers;
    const post = async (tenant: string) => {
      const response = await fetch(`${url}/plans`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ tenant }),
      });
      await response.arrayBuffer();
      return { status: response.status, limit: response.headers.get('ratelimit-limit') };
    };
    resolver.failures = ['throw', 'reject'];
    // The lookup throws: 500, and nothing is cached for this identity.
    expect(await post('acme')).toEqual({ status: 500, limit: null });
    expect(resolver.lookups).toBe(1);
    expect(numbers.cached).toBe(0);
    // Within the 10 minutes the answer would be kept, the next request asks again: this lookup rejects.
    expect(await post('acme')).toEqual({ status: 500, limit: null });
    expect(resolver.lookups).toBe(2);
    expect(numbers.cached).toBe(0);
    // Then the lookup succeeds: the request is limited by its answer, and that answer is kept.
    expect(await post('acme')).toEqual({ status: 201, limit: '5' });
    expect(resolver.lookups).toBe(3);
    expect(numbers.cached).toBe(1);
    expect(await post('acme')).toEqual({ status: 201, limit: '5' });
    expect(resolver.lookups).toBe(3);
  });

  it('holds under 4 KB of heap per cached identity of 15 KB (2,000 identities), measured by emptying it', async () => {
    setFlagsFromString('--expose-gc');
    const gc = runInNewContext('gc') as () => void;
    const heap = () => {
      gc();
      gc();
      return process.memoryUsage().heapUsed;
    };
    const { resolver, cached, forget, post } = await start(600_000);
    const huge = (i: number) => `${String(i).padStart(6, '0')}${'x'.repeat(15 * 1024)}`;
    // Warm-up: code compiled, pools and the Redis connection made, before the measure.
    for (let i = 0; i < 50; i++) await post(huge(-1 - i));
    const before = heap();
    const count = 2000;
    for (let i = 0; i < count; i += 20) await Promise.all(Array.from({ length: 20 }, (_, j) => post(huge(i + j))));
    expect(resolver.lookups).toBe(count + 50);
    expect(cached()).toBe(count + 50); // all held while measured: none expired, none evicted
    const held = heap();
    forget();
    // What the cache itself holds (the raw identities kept it at 15 KB each); the rest of the growth is
    // the app's per-request garbage, the same with one identity and no cache.
    const perEntry = (held - heap()) / (count + 50);
    const growth = (held - before) / count;
    console.log(
      `resolver cache: ${Math.round(perEntry)} B of heap per cached identity of 15 KB; the process grew ${Math.round(growth)} B per request`,
    );
    expect(perEntry).toBeGreaterThan(0);
    // About 0.5 KB on a quiet machine (an entry, its key of at most ~60 characters, the answer); up to 2 KB
    // seen beside parallel work, from what the rest of the process frees meanwhile. A cache that kept the
    // raw identity would hold more than 15 KB each: a quarter of that is the bound.
    expect(perEntry).toBeLessThan(4096);
    // A hang catcher only: 2,050 requests of 15 KB took over 30 s beside 4 CPU-bound processes.
  }, 120_000);
});
