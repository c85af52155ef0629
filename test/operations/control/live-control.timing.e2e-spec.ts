import { Controller, Get, type INestApplication, Module } from '@nestjs/common';
import { RateLimit, RateLimitInsights, RateLimitModule } from 'nest-redis-rate-limit';
import request from 'supertest';
import { createApp } from '../../support/app.js';
import { redisUrl, testPrefix } from '../../support/redis.js';

/**
 * Issue 33, items 3 and 4: limits changed live and the deny list. Two instances share a prefix; every
 * change is made through one instance's `RateLimitInsights` and must hold on the other within 2 s
 * (default `syncMs`: 1 s), with no restart, and survive an instance's restart.
 */
@Controller()
class OrdersController {
  @Get('orders')
  @RateLimit({ capacity: 2, refillPerSecond: 0.001, name: 'orders' })
  orders() {
    return { ok: true };
  }
}

function appModule(url: string, prefix: string, operations: unknown = true) {
  @Module({
    imports: [RateLimitModule.forRoot({ redis: url, keyPrefix: prefix, operations: operations as true })],
    controllers: [OrdersController],
  })
  class AppModule {}
  return AppModule;
}

const CHANGE = { by: 'ops@example.com', reason: 'test' };

/** Requests from `ip` until one is refused (at most `max`): how many were admitted. */
async function admitted(app: INestApplication, ip: string, max = 20): Promise<number> {
  for (let i = 0; i < max; i++) {
    const res = await request(app.getHttpServer()).get('/orders').set('x-forwarded-for', ip);
    if (res.status !== 200) return i;
  }
  return max;
}

/** Polls `check` every 50 ms until it holds; answers the time it took (ms), or fails after `ms`. */
async function within(ms: number, check: () => Promise<boolean>): Promise<number> {
  const start = Date.now();
  while (Date.now() - start < ms) {
    if (await check()) return Date.now() - start;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  throw new Error(`not within ${ms} ms`);
}

describe('live overrides and blocks across instances', () => {
  let url: string;
  let prefix: string;
  const apps: INestApplication[] = [];
  let a: INestApplication;
  let b: INestApplication;
  let ops: RateLimitInsights;
  let ipCounter = 0;
  const freshIp = () => `198.51.100.${++ipCounter}`;

  beforeAll(async () => {
    url = await redisUrl();
    prefix = testPrefix('live-control');
    a = await createApp(appModule(url, prefix), 'express', undefined, { trustProxy: true });
    b = await createApp(appModule(url, prefix), 'express', undefined, { trustProxy: true });
    apps.push(a, b);
    ops = a.get(RateLimitInsights);
  });

  afterAll(async () => {
    for (const app of apps) await app.close();
  });

  it("raises a policy's capacity on the other instance within 2 s, and clearing it restores the code's numbers", async () => {
    expect(await admitted(b, freshIp())).toBe(2);
    await ops.setOverride({ scope: 'orders', capacity: 5, reason: 'big launch', by: 'ops@example.com' });
    const took = await within(2_000, async () => (await admitted(b, freshIp())) === 5);
    expect(took).toBeLessThan(2_000);
    // The bucket is decided with the new numbers, and the headers say so.
    const res = await request(b.getHttpServer()).get('/orders').set('x-forwarded-for', freshIp());
    expect(res.headers['ratelimit-limit']).toBe('5');

    expect(await ops.clearOverride('orders', undefined, CHANGE)).toBe(true);
    await within(2_000, async () => (await admitted(b, freshIp())) === 2);
    expect(await ops.clearOverride('orders', undefined, CHANGE)).toBe(false);
  });

  it("raises one identity's quota only, and shadow mode lets it through while still counting", async () => {
    const customer = freshIp();
    const other = freshIp();
    await ops.setOverride({ scope: 'orders', identity: `ip:${customer}`, capacity: 4, reason: 'customer plan', by: 'ops' });
    // Polled through the other instance's view (a request would drain the bucket it measures).
    const onB = b.get(RateLimitInsights);
    await within(2_000, async () => (await onB.inspect('orders', `ip:${customer}`)).capacity === 4);
    expect(await admitted(b, customer)).toBe(4);
    expect(await admitted(b, other)).toBe(2);
    await ops.setOverride({ scope: 'orders', identity: `ip:${other}`, enforce: false, reason: 'shadow', by: 'ops' });
    await within(2_000, async () => (await onB.inspect('orders', `ip:${other}`)).enforce === false);
    expect(await admitted(b, other, 6)).toBe(6);
    expect((await ops.overrides()).map((o) => o.identity).sort()).toEqual([`ip:${customer}`, `ip:${other}`].sort());
    const audit = await ops.audit(10);
    expect(audit[0]).toMatchObject({ action: 'override', scope: 'orders', target: `ip:${other}`, by: 'ops', detail: { enforce: false } });
    await ops.clearOverride('orders', `ip:${customer}`, CHANGE);
    await ops.clearOverride('orders', `ip:${other}`, CHANGE);
  });

  it('blocks an address range on the other instance within 2 s (429, Retry-After until the end), before any bucket, and unblocks it', async () => {
    const outside = freshIp();
    const entry = await ops.block({ target: 'ip:203.0.113.0/24', seconds: 120, reason: 'abuse', by: 'ops' });
    expect(entry).toMatchObject({ target: 'ip:203.0.113.0/24', reason: 'abuse', by: 'ops' });
    // A new address of the range each time: no bucket of theirs can be what refuses.
    let host = 0;
    let refused: request.Response | undefined;
    await within(2_000, async () => {
      refused = await request(b.getHttpServer()).get('/orders').set('x-forwarded-for', `203.0.113.${++host}`);
      return refused.status === 429;
    });
    const retryAfter = Number(refused!.headers['retry-after']);
    expect(retryAfter).toBeGreaterThan(110);
    expect(retryAfter).toBeLessThanOrEqual(120);
    // Before any bucket: a blocked client's bucket is never drained, however often it asks.
    const inside = '203.0.113.200';
    for (let i = 0; i < 5; i++) expect((await request(b.getHttpServer()).get('/orders').set('x-forwarded-for', inside)).status).toBe(429);
    const inspected = await b.get(RateLimitInsights).inspect('orders', `ip:${inside}`);
    expect(inspected).toMatchObject({ tokens: 2, block: { target: 'ip:203.0.113.0/24' } });
    expect(await admitted(b, outside)).toBe(2);

    expect(await ops.unblock('ip:203.0.113.0/24', CHANGE)).toBe(true);
    await within(2_000, async () => (await request(b.getHttpServer()).get('/orders').set('x-forwarded-for', inside)).status === 200);
  });

  it('applies what is in force from its first request after a restart (read at bootstrap)', async () => {
    const ip = freshIp();
    await ops.block({ target: `ip:${ip}`, seconds: 60, reason: 'restart test', by: 'ops' });
    const restarted = await createApp(appModule(url, prefix), 'express', undefined, { trustProxy: true });
    apps.push(restarted);
    expect((await request(restarted.getHttpServer()).get('/orders').set('x-forwarded-for', ip)).status).toBe(429);
    expect(restarted.get(RateLimitInsights).status()).toMatchObject({ enabled: true, blocks: 1, syncFailing: false });
    await ops.unblock(`ip:${ip}`, CHANGE);
  });

  it('answers 403 to a blocked identity with blockedStatus: 403', async () => {
    const forbidding = await createApp(appModule(url, prefix, { blockedStatus: 403 }), 'express', undefined, { trustProxy: true });
    apps.push(forbidding);
    const ip = freshIp();
    await ops.block({ target: `ip:${ip}`, seconds: 30, reason: '403 test', by: 'ops' });
    await within(2_000, async () => (await request(forbidding.getHttpServer()).get('/orders').set('x-forwarded-for', ip)).status === 403);
    // The instance with the default answers 429.
    expect((await request(b.getHttpServer()).get('/orders').set('x-forwarded-for', ip)).status).toBe(429);
    await ops.unblock(`ip:${ip}`, CHANGE);
  });
});
