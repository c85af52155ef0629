import { type INestApplication, Logger } from '@nestjs/common';
import { Redis } from 'ioredis';
import request from 'supertest';
import type { RateLimitDecisionEvent, RateLimitModuleOptions } from 'nest-redis-rate-limit';
import { createApp, PLATFORMS, type Platform } from '../../support/app.js';
import { LogRecorder } from '../../support/log-recorder.js';
import { deleteKeys, redisUrl, testPrefix, tokensOf } from '../../support/redis.js';
import { shadowAppModule } from './shadow.controllers.js';

/**
 * Shadow mode and onDecision (issue 12, items 6 and 7's hook): a shadow policy is decided and drained
 * but never refuses, apart from the enforced ones; every decided policy is reported once.
 */
describe.each(PLATFORMS)('shadow mode and onDecision on %s', (platform: Platform) => {
  const prefix = testPrefix(`shadow-${platform}`);
  const recorder = new LogRecorder();
  let client: Redis;
  const apps: INestApplication[] = [];
  let started = 0;

  async function start(options: RateLimitModuleOptions = {}): Promise<{ url: string; key: (scope: string) => string }> {
    const keyPrefix = `${prefix}${started++}:`;
    const app = await createApp(shadowAppModule({ redis: await redisUrl(), keyPrefix, ...options }), platform);
    apps.push(app);
    await app.listen(0, '127.0.0.1');
    Logger.overrideLogger(recorder);
    recorder.clear();
    return { url: await app.getUrl(), key: (scope) => `${keyPrefix}{ip:127.0.0.1}:${scope}` };
  }

  const hasHeaders = (response: request.Response) =>
    Object.keys(response.headers).some((name) => /^(x-)?ratelimit|^retry-after$/.test(name));

  beforeAll(async () => {
    client = new Redis(await redisUrl());
  });
  afterEach(async () => {
    await Promise.all(apps.splice(0).map((app) => app.close()));
  });
  afterAll(async () => {
    Logger.overrideLogger(false);
    await deleteKeys(client, prefix);
    await client.quit();
  });

  describe('shadow policies', () => {
    it('never refuse, drain their bucket exactly, send no headers, leave their verdict on the request and log once', async () => {
      const { url, key } = await start();
      const bodies = [];
      for (let i = 0; i < 5; i++) {
        const response = await request(url).get('/sh/only').expect(200);
        expect(hasHeaders(response)).toBe(false);
        bodies.push(response.body);
      }
      const tokens = await tokensOf(client, key('sh-only'));
      expect(tokens).toBeGreaterThanOrEqual(0);
      expect(tokens).toBeLessThan(0.05);
      expect(bodies.map((b) => b.enforced)).toEqual([[], [], [], [], []]);
      expect(bodies.map((b) => b.shadow)).toEqual([
        { policies: ['sh-only'], allowed: true, remaining: [1] },
        { policies: ['sh-only'], allowed: true, remaining: [0] },
        { policies: ['sh-only'], allowed: false, remaining: [0] },
        { policies: ['sh-only'], allowed: false, remaining: [0] },
        { policies: ['sh-only'], allowed: false, remaining: [0] },
      ]);
      // Throttled: three refusals within seconds, one line.
      const lines = recorder.of('RateLimit', 'warn').filter((line) => line.startsWith('Shadow policy'));
      expect(lines).toHaveLength(1);
      expect(lines[0]).toContain('Shadow policy sh-only on ShadowController.only would have refused a request');
      expect(lines[0]).toContain('enforce: false');
    });

    it('are decided apart: the enforced policy beside one refuses on its own numbers, and alone describes the response', async () => {
      const { url, key } = await start();
      const responses = [];
      for (let i = 0; i < 4; i++) responses.push(await request(url).get('/sh/mixed'));
      expect(responses.map((r) => r.status)).toEqual([200, 200, 200, 429]);
      expect(responses.map((r) => r.headers['x-ratelimit-limit'])).toEqual(['3', '3', '3', '3']);
      expect(responses.map((r) => r.headers['x-ratelimit-remaining'])).toEqual(['2', '1', '0', '0']);
      expect(responses[3].headers['retry-after']).toBe('1000');
      expect(responses[0].body).toEqual({
        enforced: ['mx-enf'],
        allowed: true,
        shadow: { policies: ['mx-sh'], allowed: true, remaining: [0] },
      });
      expect(responses[1].body.shadow).toEqual({ policies: ['mx-sh'], allowed: false, remaining: [0] });
      expect(await tokensOf(client, key('mx-enf'))).toBeLessThan(0.05);
      expect(await tokensOf(client, key('mx-sh'))).toBeLessThan(0.05);
      expect(
        recorder.of('RateLimit', 'warn').filter((line) => line.includes('Shadow policy mx-sh on ShadowController.mixed')),
      ).toHaveLength(1);
    });

    it('module enforce: false makes every policy without its own enforce a shadow one', async () => {
      const { url, key } = await start({ enforce: false });
      for (let i = 0; i < 5; i++) {
        const response = await request(url).get('/sh/mixed').expect(200);
        expect(hasHeaders(response)).toBe(false);
        expect(response.body.enforced).toEqual([]);
        expect(response.body.shadow.policies).toEqual(['mx-enf', 'mx-sh']);
      }
      // The shadow policies decide together, all or nothing as enforced ones would: mx-sh (1) refused
      // from the 2nd request on, so mx-enf (3) gave only the 1st request a token.
      const enfTokens = await tokensOf(client, key('mx-enf'));
      expect(enfTokens).toBeGreaterThanOrEqual(2);
      expect(enfTokens).toBeLessThan(2.05);
      expect(await tokensOf(client, key('mx-sh'))).toBeLessThan(0.05);
      // enforce: true on the policy wins over the module.
      const forced = await request(url).get('/sh/forced').expect(200);
      expect(forced.headers['x-ratelimit-limit']).toBe('2');
      expect(forced.body).toEqual({ enforced: ['forced'], allowed: true });
      await request(url).get('/sh/forced').expect(200);
      await request(url).get('/sh/forced').expect(429);
    });

    it('exactness: 20 parallel requests give exactly 5 × 200 and 15 × 429, and drain the shadow bucket of 2 exactly', async () => {
      const { url, key } = await start();
      const responses = await Promise.all(Array.from({ length: 20 }, () => request(url).get('/sh/exact')));
      const statuses = responses.map((r) => r.status);
      expect(statuses.filter((s) => s === 200)).toHaveLength(5);
      expect(statuses.filter((s) => s === 429)).toHaveLength(15);
      for (const scope of ['ex-enf', 'ex-sh']) {
        const tokens = await tokensOf(client, key(scope));
        expect(tokens).toBeGreaterThanOrEqual(0);
        expect(tokens).toBeLessThan(0.05);
      }
    });
  });

  describe('onDecision', () => {
    /** The events without their context (checked apart). */
    const plain = (events: RateLimitDecisionEvent[]) => events.map(({ context: _context, ...rest }) => rest);

    it.each([true, false])('reports each decided policy once, with its outcome and source (denyCache %s)', async (denyCache) => {
      const events: RateLimitDecisionEvent[] = [];
      const { url } = await start({ denyCache, onDecision: (event) => events.push(event) });
      const statuses = [];
      for (let i = 0; i < 4; i++) statuses.push((await request(url).get('/sh/plain')).status);
      expect(statuses).toEqual([200, 200, 429, 429]);
      const base = { route: 'ShadowController.plain', scope: 'pl', limit: 2 };
      expect(plain(events)).toEqual([
        { ...base, outcome: 'allowed', source: 'store', remaining: 1, retryAfterSeconds: 0 },
        { ...base, outcome: 'allowed', source: 'store', remaining: 0, retryAfterSeconds: 0 },
        { ...base, outcome: 'denied', source: 'store', remaining: 0, retryAfterSeconds: 1000 },
        { ...base, outcome: 'denied', source: denyCache ? 'cache' : 'store', remaining: 0, retryAfterSeconds: 1000 },
      ]);
      for (const event of events) {
        expect(event.context.getType()).toBe('http');
        expect(String(event.context.switchToHttp().getRequest().url)).toBe('/sh/plain');
      }
    });

    it("reports shadow refusals as 'shadow-denied', beside the enforced policy's outcome", async () => {
      const events: RateLimitDecisionEvent[] = [];
      const { url } = await start({ onDecision: (event) => events.push(event) });
      for (let i = 0; i < 4; i++) await request(url).get('/sh/mixed');
      expect(events.map((e) => `${e.scope}:${e.outcome}`)).toEqual([
        'mx-enf:allowed',
        'mx-sh:allowed',
        'mx-enf:allowed',
        'mx-sh:shadow-denied',
        'mx-enf:allowed',
        'mx-sh:shadow-denied',
        // The request the enforced policy refuses does not reach the shadow one (enforced, it would not either).
        'mx-enf:denied',
      ]);
      expect(events.filter((e) => e.scope === 'mx-sh').map((e) => e.limit)).toEqual([1, 1, 1]);
      events.length = 0;
      for (let i = 0; i < 3; i++) await request(url).get('/sh/only').expect(200);
      expect(events.map((e) => e.outcome)).toEqual(['allowed', 'allowed', 'shadow-denied']);
    });

    it('a listener that throws breaks no request, and is logged', async () => {
      let calls = 0;
      const { url } = await start({
        onDecision: () => {
          calls++;
          throw new Error('audit sink down');
        },
      });
      const first = await request(url).get('/sh/plain').expect(200);
      expect(first.headers['x-ratelimit-remaining']).toBe('1');
      await request(url).get('/sh/plain').expect(200);
      await request(url).get('/sh/plain').expect(429);
      expect(calls).toBe(3);
      const lines = recorder.of('RateLimit', 'warn').filter((line) => line.startsWith('A rate-limit decision listener threw'));
      expect(lines.length).toBeGreaterThanOrEqual(1);
      expect(lines[0]).toContain('audit sink down');
    });
  });
});
