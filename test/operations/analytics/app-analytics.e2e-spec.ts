import { randomUUID } from 'node:crypto';
import { Controller, Get, type INestApplication, Module } from '@nestjs/common';
import { Redis } from 'ioredis';
import { RateLimit, RateLimitInsights, RateLimitModule, type RateLimitModuleOptions } from 'nest-redis-rate-limit';
import request from 'supertest';
import { createApp } from '../../support/app.js';
import { RedisServer, testPrefix } from '../../support/redis.js';

/**
 * Issue 33, item 1, through a running app: who is limited, with no round trip per request. Requests
 * are counted in memory; the periodic call writes them (`syncMs`), and `RateLimitInsights` reads the
 * top identities and the per-second series back. MONITOR on a server of the test's own: each request is
 * one script call, and every other command the app sends is the periodic call's (`{ops}` keys).
 */
@Controller()
class SearchController {
  @Get('search')
  @RateLimit({ capacity: 3, refillPerSecond: 0.01, name: 'search' })
  search() {
    return {};
  }
}

function appModule(options: RateLimitModuleOptions) {
  @Module({ imports: [RateLimitModule.forRoot(options)], controllers: [SearchController] })
  class AnalyticsAppModule {}
  return AnalyticsAppModule;
}

async function until<T>(read: () => Promise<T>, done: (value: T) => boolean, ms = 5_000): Promise<T> {
  const end = Date.now() + ms;
  let value = await read();
  while (!done(value) && Date.now() < end) {
    await new Promise((resolve) => setTimeout(resolve, 50));
    value = await read();
  }
  return value;
}

describe('analytics of a running app', () => {
  let server: RedisServer;
  let app: INestApplication;
  let monitorConnection: Redis;
  let monitor: Redis;
  const seen: { args: string[]; source: string }[] = [];

  beforeAll(async () => {
    server = await RedisServer.start();
    monitorConnection = new Redis(server.url);
    monitor = await monitorConnection.monitor();
    monitor.on('monitor', (_time: string, args: unknown[], source: string) => seen.push({ args: args.map(String), source }));
    app = await createApp(
      appModule({ redis: server.url, keyPrefix: testPrefix('app-analytics'), operations: { syncMs: 250 } }),
      'express',
      (a) => a.useLogger(false),
      { trustProxy: true },
    );
  });

  afterAll(async () => {
    await app?.close();
    monitor?.disconnect();
    monitorConnection?.disconnect();
    await server?.stop();
  });

  it('counts allowed and refused per identity, gives the top refused and the series, with one script call per request', async () => {
    const marker = randomUUID();
    await monitorConnection.echo(marker);
    // 203.0.113.1: 3 allowed, 5 refused; .2: 3 allowed, 1 refused; .3: 2 allowed.
    const plan: [string, number][] = [
      ['203.0.113.1', 8],
      ['203.0.113.2', 4],
      ['203.0.113.3', 2],
    ];
    let requests = 0;
    for (const [ip, n] of plan) {
      for (let i = 0; i < n; i++, requests++) await request(app.getHttpServer()).get('/search').set('x-forwarded-for', ip);
    }
    const insights = app.get(RateLimitInsights);
    const top = await until(
      () => insights.top('search', { by: 'refused', windowSeconds: 300 }),
      (entries) => entries.reduce((sum, e) => sum + e.refused, 0) === 6,
    );
    expect(top).toEqual([
      { identity: 'ip:203.0.113.1', allowed: 3, refused: 5 },
      { identity: 'ip:203.0.113.2', allowed: 3, refused: 1 },
    ]);
    const byAllowed = await insights.top('search', { by: 'allowed', windowSeconds: 300, limit: 2 });
    expect(byAllowed.map((e) => e.allowed)).toEqual([3, 3]);
    const series = await insights.series('search', { seconds: 60 });
    expect(series).toHaveLength(60);
    expect(series.reduce((sum, p) => sum + p.allowed, 0)).toBe(8);
    expect(series.reduce((sum, p) => sum + p.refused, 0)).toBe(6);

    // What the app sent: one script call per request on a bucket key, and the periodic call's commands on {ops} keys.
    await monitorConnection.echo(`${marker}-end`);
    await until(
      () => Promise.resolve(seen.some((c) => c.args[1] === `${marker}-end`)),
      (found) => found,
    );
    const from = seen.findIndex((c) => c.args[1] === marker);
    const to = seen.findIndex((c) => c.args[1] === `${marker}-end`);
    const sent = seen.slice(from + 1, to).filter((c) => c.source !== 'lua' && c.args[0].toLowerCase() !== 'echo');
    const periodic = sent.filter((c) => c.args.some((arg) => arg.includes('{ops}')));
    const rest = sent.filter((c) => !periodic.includes(c));
    // 14 requests, 10 script calls: after Redis refused .1 once, its next 4 refusals came from the deny
    // cache (no call), and were counted all the same (refused: 5 above).
    expect(requests).toBe(14);
    expect(rest.map((c) => c.args[0].toLowerCase())).toEqual(new Array(10).fill('evalsha'));
    expect(periodic.length).toBeGreaterThan(0);
  });
});
