import type { INestApplication } from '@nestjs/common';
import { networkInterfaces } from 'node:os';
import { Script } from 'node:vm';
import { RateLimitDashboardModule, RateLimitInsights } from 'nest-redis-rate-limit';
import request from 'supertest';
import { createApp, PLATFORMS } from '../../support/app.js';
import { ADMIN_TOKEN, shopApp } from './dashboard-app.js';

/**
 * Issue 33, item 5: the dashboard's defences, on Express and Fastify. It will not start unguarded; without
 * the app's auth there is no page and no API; every answer is no-store and nosniff, the page and assets
 * under a strict CSP with nothing inline; a write that a cross-site page could send is refused (403)
 * before it is read; bad input is a 400 with the reason; and in each refused case nothing changed. The
 * memory store: no Redis (the browser tests use Redis and two instances).
 */
const AUTH = { authorization: `Bearer ${ADMIN_TOKEN}` };
const WRITE = { ...AUTH, 'content-type': 'application/json', 'x-rate-limit-dashboard': '1' };
const CSP =
  "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

describe('RateLimitDashboardModule.register', () => {
  it('refuses a dashboard without a guard, with ERR_RATE_LIMIT_DASHBOARD_UNGUARDED', () => {
    expect(() => RateLimitDashboardModule.register({})).toThrow(
      expect.objectContaining({
        code: 'ERR_RATE_LIMIT_DASHBOARD_UNGUARDED',
        message: expect.stringMatching(/^RateLimitDashboardModule.register\(\) has no guard/),
      }),
    );
    expect(() => RateLimitDashboardModule.register({ unauthenticatedOnLoopback: false })).toThrow(
      expect.objectContaining({ code: 'ERR_RATE_LIMIT_DASHBOARD_UNGUARDED' }),
    );
  });

  it.each([
    [{ guard: class {}, gaurd: 1 }, 'ERR_RATE_LIMIT_UNKNOWN_OPTION', /unknown key "gaurd" \(did you mean "guard"\?\)/],
    [{ guard: class {}, path: 'admin/:id' }, 'ERR_RATE_LIMIT_INVALID_OPTION', /path must be segments/],
    [{ guard: 'yes' }, 'ERR_RATE_LIMIT_INVALID_OPTION', /guard must be a guard class/],
    [{ unauthenticatedOnLoopback: 'true' }, 'ERR_RATE_LIMIT_INVALID_OPTION', /unauthenticatedOnLoopback must be true or false/],
  ])('refuses %j', (options, code, message) => {
    expect(() => RateLimitDashboardModule.register(options as never)).toThrow(
      expect.objectContaining({ code, message: expect.stringMatching(message) }),
    );
  });
});

describe.each(PLATFORMS)('the dashboard on %s', (platform) => {
  let app: INestApplication;
  let insights: RateLimitInsights;
  let origin: string;
  const server = () => app.getHttpServer();

  beforeAll(async () => {
    app = await createApp(
      shopApp({ store: 'memory' }, { guard: (await import('./dashboard-app.js')).AdminGuard, path: '/ops/rate-limit/' }),
      platform,
    );
    insights = app.get(RateLimitInsights);
    await app.listen(0, '127.0.0.1');
    origin = `http://127.0.0.1:${(app.getHttpServer().address() as { port: number }).port}`;
  });
  afterAll(() => app.close());

  /** What a refused request must leave as it was: the audit trail, the blocks and the overrides. */
  async function nothingChanged(): Promise<void> {
    expect(await insights.audit()).toEqual([]);
    expect(await insights.blocks()).toEqual([]);
    expect(await insights.overrides()).toEqual([]);
  }

  it.each([
    '',
    '/assets/app.js',
    '/assets/app.css',
    '/api/state',
    '/api/series?scope=orders',
    '/api/top?scope=orders',
    '/api/identity?scope=orders&identity=ip:1.2.3.4',
  ])('gives no page and no API without the app auth: GET /ops/rate-limit%s is 403', async (path) => {
    const res = await request(server()).get(`/ops/rate-limit${path}`).set('authorization', 'Bearer wrong');
    expect(res.status).toBe(403);
    expect(res.text).not.toMatch(/Rate limits|policies|function/);
    expect(res.headers['cache-control']).toBe('no-store');
  });

  it('refuses a change without the app auth, and nothing changes', async () => {
    const res = await request(server())
      .post('/ops/rate-limit/api/block')
      .set({ ...WRITE, authorization: 'Bearer wrong' })
      .send({ target: 'ip:9.9.9.9', seconds: 60, reason: 'x' });
    expect(res.status).toBe(403);
    await nothingChanged();
  });

  it('serves the page and its assets with no-store, nosniff and the CSP, and nothing inline', async () => {
    const page = await request(server()).get('/ops/rate-limit').set(AUTH);
    expect(page.status).toBe(200);
    expect(page.headers['content-type']).toMatch(/^text\/html/);
    // The assets are addressed from the page's own path (no <base> under the CSP).
    expect(page.text).toContain('<script src="/ops/rate-limit/assets/app.js" defer></script>');
    expect(page.text).toContain('<link rel="stylesheet" href="/ops/rate-limit/assets/app.css">');
    expect(page.text.match(/<script\b[^>]*>/g)).toEqual(['<script src="/ops/rate-limit/assets/app.js" defer>']);
    expect(page.text).not.toMatch(/<style|\sstyle=|\son[a-z]+=|javascript:/i);
    for (const [path, type] of [
      ['', /^text\/html/],
      ['/assets/app.js', /^text\/javascript/],
      ['/assets/app.css', /^text\/css/],
      ['/api/state', /^application\/json/],
    ] as const) {
      const res = await request(server()).get(`/ops/rate-limit${path}`).set(AUTH);
      expect(res.status).toBe(200);
      expect(res.headers['content-type']).toMatch(type);
      expect(res.headers).toMatchObject({
        'cache-control': 'no-store',
        'x-content-type-options': 'nosniff',
        'content-security-policy': CSP,
      });
    }
    const script = await request(server()).get('/ops/rate-limit/assets/app.js').set(AUTH);
    expect(() => new Script(script.text)).not.toThrow();
    expect(script.text).not.toMatch(/\beval\(|new Function|innerHTML\s*=|setAttribute\('style'/);
  });

  it('answers the state: health, operations, policies with their numbers', async () => {
    const res = await request(server()).get('/ops/rate-limit/api/state').set(AUTH);
    expect(res.body.health).toMatchObject({ status: 'up', store: 'memory', fallbackDecisionsLastMinute: 0 });
    expect(res.body.operations).toMatchObject({ enabled: true, overrides: 0, blocks: 0 });
    expect(res.body.policies.map((p: { scope: string }) => p.scope)).toEqual(['export', 'orders', 'search']);
    expect(res.body.policies[1]).toMatchObject({ scope: 'orders', capacity: 5, refillPerSecond: 0.01, enforce: true, keyBy: 'ip' });
  });

  it.each([
    ['without the dashboard header', { 'x-rate-limit-dashboard': undefined }, /x-rate-limit-dashboard: 1/],
    ['as a form', { 'content-type': 'application/x-www-form-urlencoded' }, /Content-Type: application\/json/],
    ['as text/plain (a no-cors fetch)', { 'content-type': 'text/plain' }, /Content-Type: application\/json/],
    ['from another origin', { origin: 'http://evil.example' }, /another origin/],
    ['from another port of this host', { origin: 'http://127.0.0.1:1' }, /another origin/],
    ['from an opaque origin', { origin: 'null' }, /another origin/],
    ['from the same site but another origin', { 'sec-fetch-site': 'same-site' }, /another site/],
    ['from another site', { 'sec-fetch-site': 'cross-site' }, /another site/],
  ])('refuses a block %s with 403, and nothing changes', async (_, headers, message) => {
    const req = request(server()).post('/ops/rate-limit/api/block');
    for (const [name, value] of Object.entries({ ...WRITE, ...headers })) if (value !== undefined) req.set(name, value);
    const res = await req.send(JSON.stringify({ target: 'ip:9.9.9.9', seconds: 60, reason: 'forged' }));
    expect(res.status).toBe(403);
    expect(res.body.message).toMatch(message);
    await nothingChanged();
  });

  it.each([
    ['api/block', { target: 'ip:9.9.9.9', seconds: 60, reason: 'x', by: 'mallory' }, /unknown field "by"/],
    ['api/block', { target: 'ip:9.9.9.9', seconds: 0, reason: 'x' }, /seconds must be at least 1 and at most 2592000 \(got 0\)/],
    ['api/block', { target: 'ip:9.9.9.9', seconds: 1.5, reason: 'x' }, /seconds must be a whole number/],
    ['api/block', { target: 'ip:9.9.9.9', seconds: '60', reason: 'x' }, /seconds must be a number/],
    ['api/block', { target: 'ip:9.9.9.9', seconds: 60 }, /reason is required/],
    ['api/block', { target: 'ip:9.9.9.9', seconds: 60, reason: 'x'.repeat(201) }, /reason must be at most 200 characters \(got 201\)/],
    ['api/block', { target: 'ip:not-an-address', seconds: 60, reason: 'x' }, /target/],
    ['api/block', [1, 2], /the body must be a JSON object/],
    ['api/override', { scope: 'nope', capacity: 5, reason: 'x' }, /scope "nope" is not the name of a route policy/],
    ['api/override', { scope: 'orders', capacity: 1e12, reason: 'x' }, /capacity must be at least 1 and at most 1000000000/],
    ['api/override', { scope: 'orders', enforce: 'no', reason: 'x' }, /enforce must be true or false/],
    ['api/override', { scope: 'orders', reason: 'x' }, /at least one of capacity, refillPerSecond, enforce/],
    ['api/override', { scope: 'orders', capacity: 5, reason: 'x', identity: 'key:sk_live_raw_secret' }, /identity/],
    ['api/reset', { scope: 'orders' }, /identity is required/],
    ['api/unblock', { target: 'ip:9.9.9.9', reason: 'x\u0000' }, /reason must not contain control characters/],
  ])('answers POST %s %j with 400 and the reason, and nothing changes', async (path, body, message) => {
    const res = await request(server()).post(`/ops/rate-limit/${path}`).set(WRITE).send(JSON.stringify(body));
    expect(res.status).toBe(400);
    expect(res.body.message).toMatch(message);
    expect(JSON.stringify(res.body)).not.toContain('sk_live_raw_secret');
    await nothingChanged();
  });

  it.each([
    ['api/top?scope=orders&window=30', /window must be at least 60 and at most 86400 \(got 30\)/],
    ['api/top?scope=orders&by=everything', /by must be one of refused, allowed/],
    ['api/top?scope=orders&scope=search', /scope must be given once/],
    ['api/series?scope=orders&extra=1', /unknown field "extra"/],
    ['api/series', /scope is required/],
    ['api/identity?scope=orders&identity=nobody', /identity must be as the limiter keys it/],
  ])('answers GET %s with 400 and the reason', async (path, message) => {
    const res = await request(server()).get(`/ops/rate-limit/${path}`).set(AUTH);
    expect(res.status).toBe(400);
    expect(res.body.message).toMatch(message);
  });

  it('writes a change with the operator of the request auth, never one from the body, and reads it back', async () => {
    const res = await request(server())
      .post('/ops/rate-limit/api/block')
      .set(WRITE)
      .set({ origin, 'sec-fetch-site': 'same-origin' })
      .send({ target: 'ip:9.9.9.9', seconds: 60, reason: 'scraping' });
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({ target: 'ip:9.9.9.9', by: 'alice@example.com', reason: 'scraping' });
    const state = await request(server()).get('/ops/rate-limit/api/state').set(AUTH);
    expect(state.body.blocks).toEqual([expect.objectContaining({ target: 'ip:9.9.9.9', by: 'alice@example.com' })]);
    expect(state.body.audit[0]).toMatchObject({ action: 'block', by: 'alice@example.com', target: 'ip:9.9.9.9', reason: 'scraping' });
    const unblock = await request(server()).post('/ops/rate-limit/api/unblock').set(WRITE).send({ target: 'ip:9.9.9.9' });
    expect(unblock.body).toEqual({ removed: true });
  });
});

describe.each(PLATFORMS)('unauthenticatedOnLoopback on %s', (platform) => {
  let app: INestApplication;
  let port: number;
  const external = Object.values(networkInterfaces())
    .flat()
    .find((i) => i !== undefined && i.family === 'IPv4' && !i.internal)?.address;

  beforeAll(async () => {
    app = await createApp(shopApp({ store: 'memory' }, { unauthenticatedOnLoopback: true }), platform);
    await app.listen(0, '0.0.0.0');
    port = (app.getHttpServer().address() as { port: number }).port;
  });
  afterAll(() => app.close());

  it('serves the page to this machine without auth', async () => {
    const res = await fetch(`http://127.0.0.1:${port}/rate-limit`);
    expect(res.status).toBe(200);
    expect(await res.text()).toContain('<title>Rate limits</title>');
  });

  it('answers 404 to a request a proxy forwarded, though it came from loopback', async () => {
    for (const path of ['/rate-limit', '/rate-limit/api/state']) {
      const res = await fetch(`http://127.0.0.1:${port}${path}`, { headers: { 'x-forwarded-for': '203.0.113.7' } });
      expect(res.status).toBe(404);
      expect(await res.text()).not.toContain('Rate limits');
    }
  });

  (external ? it : it.skip)('answers 404 to every request from another address, page, API and writes alike', async () => {
    for (const path of ['/rate-limit', '/rate-limit/assets/app.js', '/rate-limit/api/state']) {
      const res = await fetch(`http://${external}:${port}${path}`);
      expect(res.status).toBe(404);
      expect(res.headers.get('cache-control')).toBe('no-store');
    }
    const write = await fetch(`http://${external}:${port}/rate-limit/api/block`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-rate-limit-dashboard': '1' },
      body: JSON.stringify({ target: 'ip:9.9.9.9', seconds: 60, reason: 'x' }),
    });
    expect(write.status).toBe(404);
    expect(await app.get(RateLimitInsights).blocks()).toEqual([]);
  });
});
