import type { INestApplication } from '@nestjs/common';
import type { NestExpressApplication } from '@nestjs/platform-express';
import { mkdirSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { RateLimitInsights } from 'nest-redis-rate-limit';
import { type Browser, type BrowserContext, chromium, type Page } from 'playwright-core';
import request from 'supertest';
import { createApp } from '../../support/app.js';
import { deleteKeys, redisUrl, testPrefix } from '../../support/redis.js';
import { Redis } from 'ioredis';
import { ADMIN_TOKEN, shopApp } from './dashboard-app.js';

/**
 * Issue 33, items 5 and 8: the dashboard in a real browser (Debian's chromium, driven by playwright-core)
 * against the real Redis and two instances sharing a key prefix: A (Express) serves the page, B (Fastify)
 * takes the traffic. The test's traffic shows in the chart and the top list; a block and a raised capacity
 * made in the page hold on B within 2 s; without the app's auth there is no page; a cross-origin page
 * (another port of the same host, so the browser sends the session cookie) forges writes by fetch and by a
 * form, and nothing changes; bad input in the page is answered with the reason. Screenshots go to
 * test-artifacts/dashboard/.
 */
const ROOT = fileURLToPath(new URL('../../../', import.meta.url));
const ARTIFACTS = join(ROOT, 'test-artifacts', 'dashboard');
const CHROMIUM = process.env.CHROMIUM_PATH ?? '/usr/bin/chromium';

let a: INestApplication;
let b: INestApplication;
let origin: string;
let browser: Browser;
let context: BrowserContext;
let page: Page;
let evil: Server;
let evilOrigin: string;
let prefix: string;
/** What reached A's dashboard API, as A saw it: the forged requests must arrive, cookie and all, and be refused. */
const arrived: Array<{ path: string; origin?: string; type?: string; cookie: boolean; status?: number }> = [];
/** CSP violations and script errors seen by the page. */
const problems: string[] = [];

/** B's answer to GET /orders from `ip`. */
function order(ip: string) {
  return request(b.getHttpServer()).get('/orders').set('x-forwarded-for', ip);
}

/** B's answer to GET /search from `ip` (50 tokens, 10/s: polling it every 50 ms for seconds never empties it). */
function search(ip: string) {
  return request(b.getHttpServer()).get('/search').set('x-forwarded-for', ip);
}

/** Polls `check` every 50 ms until it holds; answers the time it took, or fails after `ms`. */
async function within(ms: number, check: () => Promise<boolean>): Promise<number> {
  const start = Date.now();
  while (Date.now() - start < ms) {
    if (await check()) return Date.now() - start;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  throw new Error(`not within ${ms} ms`);
}

async function shot(name: string, target: Page = page): Promise<void> {
  await target.screenshot({ path: join(ARTIFACTS, `${name}.png`), fullPage: true });
}

/** A page of another origin (another port of this host): what a site the operator visits could serve. */
function evilPage(target: string): string {
  const body = JSON.stringify({ target: 'ip:6.6.6.6', seconds: 600, reason: 'forged' });
  return `<!doctype html><html><body>
<form id="f" method="POST" enctype="text/plain" action="${target}/rate-limit/api/block">
<input name='{"target":"ip:6.6.6.7","seconds":600,"reason":"forged","x":"' value='"}'></form>
<script>
window.forge = async () => {
  const results = [];
  for (const init of [
    { mode: 'cors', headers: { 'content-type': 'application/json', 'x-rate-limit-dashboard': '1' } },
    { mode: 'no-cors', headers: { 'content-type': 'text/plain' } },
  ]) {
    try {
      const res = await fetch('${target}/rate-limit/api/block', { method: 'POST', credentials: 'include', body: '${body}', ...init });
      results.push(res.type + ' ' + res.status);
    } catch (e) { results.push('error ' + e.message); }
  }
  return results;
};
</script></body></html>`;
}

beforeAll(async () => {
  mkdirSync(ARTIFACTS, { recursive: true });
  const url = await redisUrl();
  prefix = testPrefix('dashboard-browser');
  a = await createApp(
    shopApp({ redis: url, keyPrefix: prefix }),
    'express',
    (app) => {
      // An app that answers CORS for any origin with credentials (a common mistake): the preflight passes,
      // so only the dashboard's own check stands between a forged fetch and a change.
      app.enableCors({ origin: true, credentials: true });
      (app as NestExpressApplication).use(
        (req: { url: string; headers: Record<string, string> }, res: { on: Function; statusCode: number }, next: () => void) => {
          if (req.url.includes('/api/block')) {
            const seen = {
              path: req.url,
              origin: req.headers.origin,
              type: req.headers['content-type'],
              cookie: (req.headers.cookie ?? '').includes(ADMIN_TOKEN),
            } as (typeof arrived)[number];
            arrived.push(seen);
            res.on('finish', () => (seen.status = res.statusCode));
          }
          next();
        },
      );
    },
    { trustProxy: true },
  );
  b = await createApp(shopApp({ redis: url, keyPrefix: prefix }, false), 'fastify', undefined, { trustProxy: true });
  await a.listen(0, '127.0.0.1');
  origin = `http://127.0.0.1:${(a.getHttpServer().address() as { port: number }).port}`;
  evil = createServer((_, res) => res.writeHead(200, { 'content-type': 'text/html' }).end(evilPage(origin)));
  await new Promise<void>((resolve) => evil.listen(0, '127.0.0.1', resolve));
  evilOrigin = `http://127.0.0.1:${(evil.address() as { port: number }).port}`;

  browser = await chromium.launch({ executablePath: CHROMIUM, args: ['--no-sandbox'] });
  context = await browser.newContext({ viewport: { width: 1280, height: 900 }, colorScheme: 'light' });
  // The app's session cookie: sent by the browser to every port of 127.0.0.1, the forging page's requests too.
  await context.addCookies([{ name: 'session', value: ADMIN_TOKEN, url: origin, sameSite: 'Lax' }]);
  page = await context.newPage();
  // A CSP violation is reported to the console; so is each answer of 400 the test provokes, not counted.
  await context.addInitScript({
    content:
      "document.addEventListener('securitypolicyviolation', (e) => console.error('CSP violation: ' + e.violatedDirective + ' ' + e.blockedURI))",
  });
  page.on('console', (message) => message.type() === 'error' && !/status of 400/.test(message.text()) && problems.push(message.text()));
  page.on('pageerror', (error) => problems.push(error.message));
}, 30_000);

afterAll(async () => {
  await browser?.close();
  await new Promise((resolve) => evil?.close(resolve));
  await a?.close();
  await b?.close();
  const client = new Redis(await redisUrl());
  await deleteKeys(client, prefix);
  await client.quit();
});

it('shows the traffic of the other instance in the chart and the top list', async () => {
  for (let i = 0; i < 9; i++) await order('198.51.100.7'); // 5 allowed, 4 refused
  for (let i = 0; i < 3; i++) await order('198.51.100.9'); // 3 allowed
  const response = await page.goto(`${origin}/rate-limit`);
  expect(response?.status()).toBe(200);
  await page.selectOption('#policy', 'orders');
  const row = page.locator('#top-body tr', { hasText: 'ip:198.51.100.7' });
  await row.waitFor({ timeout: 6000 });
  await expect(row.locator('td').nth(0).textContent()).resolves.toBe('4');
  // A locator's wait, not waitForFunction: a string predicate that is not true at once is polled with
  // eval in the page, which the dashboard's CSP refuses (seen when the chart was late, 2026-12-06).
  await page.locator('#chart-caption', { hasText: /8 allowed, 4 refused/ }).waitFor({ timeout: 4000 });
  expect(await page.locator('#chart svg polyline.refused').count()).toBe(1);
  expect(await page.locator('#health-status').textContent()).toMatch(/^Up: redis decides every request/);
});

it('blocks an identity from the page, and the other instance refuses it within 2 s', async () => {
  expect((await search('198.51.100.20')).status).toBe(200);
  await page.getByRole('button', { name: 'Block an identity or range…' }).click();
  const dialog = page.getByRole('dialog');
  await dialog.getByLabel('Identity or address range').fill('ip:198.51.100.20');
  await dialog.getByLabel('Reason').fill('credential stuffing');
  await dialog.getByRole('button', { name: 'Block' }).click();
  const clicked = Date.now();
  await within(2000 + 500, async () => (await search('198.51.100.20')).status === 429);
  expect(Date.now() - clicked).toBeLessThan(2000);
  // Refused by the block (until it ends in an hour), not by the bucket, on every route.
  const refused = await search('198.51.100.20');
  expect(Number(refused.headers['retry-after'])).toBeGreaterThan(3000);
  expect((await order('198.51.100.20')).status).toBe(429);
  await page.locator('#blocks-body tr', { hasText: 'ip:198.51.100.20' }).waitFor({ timeout: 3000 });
  await expect(page.locator('#result').textContent()).resolves.toMatch(/^Blocked ip:198.51.100.20 until/);
  const audit = await a.get(RateLimitInsights).audit();
  expect(audit[0]).toMatchObject({ action: 'block', target: 'ip:198.51.100.20', by: 'alice@example.com', reason: 'credential stuffing' });
});

it("raises a policy's capacity from the page, and the other instance admits more within 2 s", async () => {
  let fresh = 0;
  /** How many of 8 requests B admits from an IP it has not seen. */
  const admitted = async () => {
    const ip = `203.0.113.${++fresh}`;
    let n = 0;
    for (let i = 0; i < 8; i++) if ((await order(ip)).status === 200) n++;
    return n;
  };
  expect(await admitted()).toBe(5);
  await page.locator('#policies-body tr', { hasText: 'orders' }).getByRole('button', { name: 'Override orders' }).click();
  const dialog = page.getByRole('dialog');
  await dialog.getByLabel('Capacity (burst)').fill('0');
  await dialog.getByLabel('Reason').fill('launch day');
  await dialog.getByRole('button', { name: 'Override' }).click();
  // Bad input is answered with the reason, in the dialog, and nothing is changed.
  await expect(dialog.getByRole('alert').textContent()).resolves.toMatch(/capacity must be at least 1/);
  expect(await a.get(RateLimitInsights).overrides()).toEqual([]);
  await dialog.getByLabel('Capacity (burst)').fill('20');
  await dialog.getByRole('button', { name: 'Override' }).click();
  const clicked = Date.now();
  await within(2000 + 500, async () => (await admitted()) === 8);
  expect(Date.now() - clicked).toBeLessThan(2000);
  await page.locator('#policies-body tr', { hasText: 'orders' }).locator('.tag.override').waitFor({ timeout: 3000 });
  await shot('dashboard-desktop');
});

it('is used by keyboard: a dialog opens on Enter with the focus in it, and Escape closes it', async () => {
  await page.locator('#block-new').focus();
  await page.keyboard.press('Enter');
  await expect(page.evaluate("document.activeElement?.getAttribute('name')")).resolves.toBe('target');
  await page.getByRole('dialog').getByLabel('Identity or address range').fill('ip:10.0.0.0/8');
  await shot('dashboard-dialog');
  await page.keyboard.press('Escape');
  await expect(page.getByRole('dialog').isVisible()).resolves.toBe(false);
});

it('fits a phone screen', async () => {
  const phone = await context.newPage();
  await phone.setViewportSize({ width: 390, height: 844 });
  await phone.goto(`${origin}/rate-limit`);
  await phone.selectOption('#policy', 'orders');
  await phone.locator('#top-body tr', { hasText: 'ip:198.51.100.7' }).waitFor({ timeout: 5000 });
  await shot('dashboard-phone', phone);
  expect(await phone.evaluate<number>('document.documentElement.scrollWidth')).toBeLessThanOrEqual(390);
  await phone.close();
});

it('gives no page and no API to a browser without the app auth', async () => {
  const stranger = await browser.newContext();
  const other = await stranger.newPage();
  const response = await other.goto(`${origin}/rate-limit`);
  expect(response?.status()).toBe(403);
  expect(await other.content()).not.toContain('Rate limits');
  const api = await other.goto(`${origin}/rate-limit/api/state`);
  expect(api?.status()).toBe(403);
  await stranger.close();
});

it('changes nothing when a page of another origin forges writes, by fetch and by a form', async () => {
  const before = await a.get(RateLimitInsights).audit();
  arrived.length = 0;
  const forger = await context.newPage();
  await forger.goto(evilOrigin);
  const results = await forger.evaluate<string[]>('window.forge()');
  // The CORS fetch passes the app's preflight and is refused by the dashboard; the no-cors one is sent
  // (its answer opaque, or blocked by the browser's opaque-response blocking).
  expect(results[0]).toBe('cors 403');
  expect(results[1]).toMatch(/^(opaque 0|error )/);
  await Promise.all([
    forger.waitForURL(`${origin}/rate-limit/api/block`),
    forger.locator('#f').evaluate((f) => (f as unknown as { submit(): void }).submit()),
  ]);
  await within(2000, () => Promise.resolve(arrived.filter((r) => r.status !== undefined).length === 3));
  // All three reached the app with the session cookie (its auth would pass), from the other origin: each refused.
  expect(arrived).toEqual([
    { path: '/rate-limit/api/block', origin: evilOrigin, type: 'application/json', cookie: true, status: 403 },
    { path: '/rate-limit/api/block', origin: evilOrigin, type: 'text/plain', cookie: true, status: 403 },
    { path: '/rate-limit/api/block', origin: evilOrigin, type: 'text/plain', cookie: true, status: 403 },
  ]);
  await forger.close();
  const insights = a.get(RateLimitInsights);
  expect(await insights.audit()).toEqual(before);
  expect((await insights.blocks()).map((x) => x.target)).toEqual(['ip:198.51.100.20']);
  expect((await order('6.6.6.6')).status).toBe(200);
});

it('ran under its CSP with no violation and no script error', () => {
  expect(problems).toEqual([]);
});
