import { createHash } from 'node:crypto';
import { performance } from 'node:perf_hooks';
import type { INestApplication } from '@nestjs/common';
import { Redis } from 'ioredis';
import request from 'supertest';
import WebSocket from 'ws';
import { WsAdapter } from '@nestjs/platform-ws';
import { BucketService } from 'nest-redis-rate-limit';
import { AppModule } from '../../../apps/gateway/src/app.module.js';
import { FakePartner } from '../../../apps/gateway/src/fake-partner.js';
import { startMetrics } from '../../../apps/gateway/src/metrics.js';
import { createApp, PLATFORMS } from '../../support/app.js';
import { timedGet } from '../../support/load.js';
import { deleteKeys, freePort, keysUnder, redisUrl, testPrefix, tokensOf } from '../../support/redis.js';

const sha = (value: string) => createHash('sha256').update(value).digest('hex').slice(0, 32);

describe.each(PLATFORMS)('demo gateway on %s', (platform) => {
  const prefix = testPrefix(`gateway-${platform}`);
  let client: Redis;
  let app: INestApplication;
  const http = () => request(app.getHttpServer());

  beforeAll(async () => {
    process.env.REDIS_URL = await redisUrl();
    process.env.RATE_LIMIT_PREFIX = prefix;
    process.env.API_KEYS = 'demo-key-1,demo-key-2,reporter';
    client = new Redis(await redisUrl());
    // As main.ts does, before the app is created (once per file: both platforms' apps share the provider).
    startMetrics();
    // As main.ts does: plain WebSockets for EchoGateway.
    app = await createApp(AppModule, platform, (created) => created.useWebSocketAdapter(new WsAdapter(created)));
  });

  afterAll(async () => {
    await app.close();
    delete process.env.RATE_LIMIT_PREFIX;
    delete process.env.API_KEYS;
    await deleteKeys(client, prefix);
    await client.quit();
  });

  it('GET /api/hello allows a burst of 100 per verified API key (plus 20/s) and answers the rest with 429', async () => {
    // Over fetch's kept-alive connections to one listening server (supertest on the bare server opens a
    // server per request), all at once; 300, so that a burst that took T s holds more than the 100 + 20·T
    // the key's bucket can allow for any T under 10 s. Refused requests take no token of the per-IP
    // budget (150 + 30/s), which only the allowed ones pay for.
    if (!app.getHttpServer().listening) await app.listen(0, '127.0.0.1');
    const url = `${(await app.getUrl()).replace('[::1]', '127.0.0.1')}/api/hello`;
    const started = performance.now();
    const answers = await Promise.all(Array.from({ length: 300 }, () => timedGet(url, { 'x-api-key': 'demo-key-1' }, 30_000)));
    const seconds = (performance.now() - started) / 1000;
    expect(answers.filter((a) => a.status !== 200 && a.status !== 429).map((a) => a.error ?? a.status)).toEqual([]);
    const allowed = answers.filter((a) => a.status === 200).length;
    expect(allowed).toBeGreaterThanOrEqual(100);
    expect({ allowed, seconds }).toEqual({ allowed: Math.min(allowed, 100 + Math.ceil(20 * seconds) + 1), seconds });
    expect(seconds).toBeLessThan(10);
    const denied = answers.find((a) => a.status === 429)!;
    // 20 tokens per second: the next one is at most a second away, however long the burst took.
    expect(denied.retryAfter).toBe('1');
    expect(denied.limit).toBe('100');
    expect(denied.remaining).toBe('0');
    const other = await http().get('/api/hello').set('x-api-key', 'demo-key-2').expect(200);
    const otherSeconds = (performance.now() - started) / 1000;
    expect(other.body).toEqual({ message: 'Hello' });
    const otherTokens = await tokensOf(client, `${prefix}{key:${sha('demo-key-2')}}:HelloController.hello#0`);
    expect(otherTokens).toBeGreaterThanOrEqual(99);
    expect(otherTokens).toBeLessThanOrEqual(100);
    // The per-IP budget (150) has paid for both keys: it holds at most 150 - (allowed + 1) + 30·T, which
    // in the usual run is below the 99 of the second key: then it is the most restrictive policy.
    const ipMost = 150 - (allowed + 1) + 30 * otherSeconds;
    if (ipMost < 99) {
      expect(other.headers['x-ratelimit-limit']).toBe('150');
      expect(Number(other.headers['x-ratelimit-remaining'])).toBeLessThan(99);
    } else {
      expect(['100', '150']).toContain(other.headers['x-ratelimit-limit']);
      expect(Number(other.headers['x-ratelimit-remaining'])).toBeLessThanOrEqual(Math.min(99, Math.floor(ipMost)));
    }
  });

  it('GET /api/report sends made-up API keys to their IP bucket: 5 reports of 30 rotated keys, no key bucket', async () => {
    const statuses = [];
    for (let i = 0; i < 30; i++) statuses.push((await http().get('/api/report').set('x-api-key', `made-up-${i}`)).status);
    expect(statuses.filter((status) => status === 200)).toHaveLength(5);
    expect(statuses.slice(5).every((status) => status === 429)).toBe(true);
    const keys = await keysUnder(client, prefix);
    expect(keys).toContain(`${prefix}{ip:127.0.0.1}:reports`);
    expect(keys.filter((key) => key.endsWith(':reports'))).toEqual([`${prefix}{ip:127.0.0.1}:reports`]);
  });

  it('POST /auth/login counts only failed attempts: 5 per IP, then one every 3 minutes', async () => {
    for (let i = 0; i < 8; i++) {
      const ok = await http().post('/auth/login').send({ username: 'ann', password: 'open-sesame' }).expect(200);
      expect(ok.headers['ratelimit-remaining']).toBe('5');
    }
    for (let i = 0; i < 5; i++) await http().post('/auth/login').send({ username: 'ann', password: 'guess' }).expect(401);
    const denied = await http().post('/auth/login').send({ username: 'ann', password: 'open-sesame' }).expect(429);
    expect(Number(denied.headers['retry-after'])).toBeGreaterThanOrEqual(179);
    expect(Number(denied.headers['retry-after'])).toBeLessThanOrEqual(180);
    expect(denied.headers['ratelimit-policy']).toBe('5;w=900');
    await client.del(`${prefix}{ip:127.0.0.1}:AuthController.login`);
  });

  it('GET /api/plan gives each user the budget of their plan: 20 of 40 parallel for pro, 5 for free (plus what refilled meanwhile)', async () => {
    const burst = async (user: string) => {
      const started = performance.now();
      const responses = await Promise.all(Array.from({ length: 40 }, () => http().get('/api/plan').set('x-user', user)));
      return { responses, seconds: (performance.now() - started) / 1000 };
    };
    const { responses: pro, seconds: proSeconds } = await burst('ann');
    const { responses: free, seconds: freeSeconds } = await burst('bob');
    const proAllowed = pro.filter((r) => r.status === 200).length;
    const freeAllowed = free.filter((r) => r.status === 200).length;
    expect(proAllowed).toBeGreaterThanOrEqual(20);
    expect(proAllowed).toBeLessThanOrEqual(20 + Math.floor(2 * proSeconds));
    expect(freeAllowed).toBeGreaterThanOrEqual(5);
    expect(freeAllowed).toBeLessThanOrEqual(5 + Math.floor(0.5 * freeSeconds));
    expect(pro.find((r) => r.status === 200)!.body).toEqual({ user: 'ann', plan: 'pro' });
    expect(pro.find((r) => r.status === 429)!.headers['x-ratelimit-limit']).toBe('20');
    expect(free.find((r) => r.status === 429)!.headers['x-ratelimit-limit']).toBe('5');
    // The bucket exists under the user's identity, and was drained.
    expect(await tokensOf(client, `${prefix}{user:ann}:PlanController.plan`)).toBeLessThan(20);
  });

  it('GET /api/exports/:id/download runs at most 2 per user at once: the third gets 429 with Concurrency-Limit, a later one 200', async () => {
    const three = await Promise.all([1, 2, 3].map((id) => http().get(`/api/exports/${id}/download`).set('x-user', 'bob')));
    const statuses = three.map((r) => r.status).sort();
    expect(statuses).toEqual([200, 200, 429]);
    const refused = three.find((r) => r.status === 429)!;
    expect([refused.headers['concurrency-limit'], refused.headers['concurrency-in-flight']]).toEqual(['2', '2']);
    expect(Number(refused.headers['retry-after'])).toBeGreaterThanOrEqual(1);
    // Another user has slots of their own meanwhile, and bob's are back once his downloads ended.
    const [ann, later] = await Promise.all([
      http().get('/api/exports/4/download').set('x-user', 'ann'),
      http().get('/api/exports/5/download').set('x-user', 'bob'),
    ]);
    expect([ann.status, later.status]).toEqual([200, 200]);
    // Given back when each response closed: no slot is left in Redis.
    let left = await keysUnder(client, `${prefix}*!export-downloads`);
    for (let i = 0; i < 50 && left.length > 0; i++) {
      await new Promise((resolve) => setTimeout(resolve, 20));
      left = await keysUnder(client, `${prefix}*!export-downloads`);
    }
    expect(left).toEqual([]);
    // 10 a minute per user, in the same call as the slot: bob's refused request took no token (3 ran).
    const starts = await tokensOf(client, `${prefix}{user:bob}:export-starts`);
    expect(starts).toBeGreaterThanOrEqual(7);
    expect(starts).toBeLessThan(8);
  });

  it('GET /api/recommendations is sheddable: a flood of them leaves checkout its reserve of the storefront bucket', async () => {
    const flood = await Promise.all(Array.from({ length: 30 }, () => http().get('/api/recommendations')));
    const allowed = flood.filter((r) => r.status === 200).length;
    // 20 tokens, 4 kept from sheddable requests: 16 (plus what refilled meanwhile) at most.
    expect(allowed).toBeGreaterThanOrEqual(16);
    expect(allowed).toBeLessThan(30);
    const checkout = [];
    for (let i = 0; i < 3; i++) checkout.push((await http().get('/api/checkout')).status);
    expect(checkout).toEqual([200, 200, 200]);
  });

  it('GET /api/report costs 10 of 50 tokens', async () => {
    const first = await http().get('/api/report').set('x-api-key', 'reporter').expect(200);
    expect(first.headers['x-ratelimit-remaining']).toBe('40');
    for (let i = 0; i < 4; i++) await http().get('/api/report').set('x-api-key', 'reporter').expect(200);
    const denied = await http().get('/api/report').set('x-api-key', 'reporter').expect(429);
    expect(Number(denied.headers['retry-after'])).toBeGreaterThanOrEqual(9);
    expect(Number(denied.headers['retry-after'])).toBeLessThanOrEqual(10);
    expect(await keysUnder(client, prefix)).toContain(`${prefix}{key:${sha('reporter')}}:reports`);
  });

  it('POST /graphql limits the quote query like a route: 5 answers, then a RATE_LIMITED field error with headers', async () => {
    const ask = () => http().post('/graphql').set('content-type', 'application/json').send({ query: '{ quote }' }).expect(200);
    for (let left = 4; left >= 0; left--) {
      const res = await ask();
      expect(typeof res.body.data.quote).toBe('string');
      expect(res.headers['ratelimit-remaining']).toBe(String(left));
    }
    const refused = await ask();
    expect(refused.body.data).toBeNull();
    expect(refused.body.errors).toHaveLength(1);
    expect(refused.body.errors[0]).toMatchObject({
      message: 'Too Many Requests',
      path: ['quote'],
      extensions: { code: 'RATE_LIMITED', retryAfter: 1 },
    });
    expect(refused.headers['retry-after']).toBe('1');
    expect(await tokensOf(client, `${prefix}{ip:127.0.0.1}:QuotesResolver.quote`)).toBeLessThan(1);
  });

  it('POST /graphql like mutation costs 2 of 10: 5 likes, then refused', async () => {
    const like = () =>
      http().post('/graphql').set('content-type', 'application/json').send({ query: 'mutation { like(id: 7) }' }).expect(200);
    for (let n = 1; n <= 5; n++) expect((await like()).body.data.like).toBe(n);
    expect((await like()).body.errors[0].extensions).toMatchObject({ code: 'RATE_LIMITED', retryAfter: 2 });
  });

  it('WS /ws echoes the first 3 of 5 messages sent at once (0, 1, 2) and refuses the other 2 with RATE_LIMITED exceptions, in any order', async () => {
    if (!app.getHttpServer().listening) await app.listen(0, '127.0.0.1');
    const url = (await app.getUrl()).replace('http', 'ws') + '/ws';
    const socket = new WebSocket(url);
    try {
      await new Promise((resolve, reject) => socket.once('open', resolve).once('error', reject));
      const answers: unknown[] = [];
      const all = new Promise<void>((resolve) =>
        socket.on('message', (message) => {
          answers.push(JSON.parse(String(message)));
          if (answers.length === 5) resolve();
        }),
      );
      for (let i = 0; i < 5; i++) socket.send(JSON.stringify({ event: 'echo', data: i }));
      await all;
      // The replies interleave (each leaves when its message is done): which were echoed is what holds.
      const echoed = answers.filter((a) => (a as { event: string }).event === 'echo').map((a) => (a as { data: number }).data);
      expect(echoed.sort((a, b) => a - b)).toEqual([0, 1, 2]);
      const refused = answers.filter((a) => (a as { event: string }).event === 'exception');
      expect(refused).toEqual([
        { event: 'exception', data: { status: 'error', code: 'RATE_LIMITED', message: 'Too Many Requests', retryAfter: 1 } },
        { event: 'exception', data: { status: 'error', code: 'RATE_LIMITED', message: 'Too Many Requests', retryAfter: 1 } },
      ]);
      expect(await client.exists(`${prefix}{ip:127.0.0.1}:EchoGateway.echo`)).toBe(1);
      expect(await client.exists(`${prefix}{ws-connect:ip:127.0.0.1}`)).toBe(1);
    } finally {
      socket.terminate();
    }
  });

  it('GET /health is never limited and carries no rate-limit headers', async () => {
    for (let i = 0; i < 30; i++) {
      const res = await http().get('/health').expect(200);
      expect(res.headers['x-ratelimit-limit']).toBeUndefined();
    }
  });

  it('GET /health/rate-limit says the limiter decides on Redis, and names no address', async () => {
    const res = await http().get('/health/rate-limit').expect(200);
    expect(res.headers['x-ratelimit-limit']).toBeUndefined();
    expect(res.body).toEqual({ status: 'up', store: 'redis', failureMode: 'local', fallbackDecisionsLastMinute: 0 });
  });

  it('GET /metrics serves the decision counter in the Prometheus text format; scrapes are never limited nor counted', async () => {
    /** The `ratelimit_decisions_total` series of a scrape: labels and value. */
    const scrape = async () => {
      const res = await http().get('/metrics').expect(200);
      expect(res.headers['content-type']).toMatch(/^text\/plain/);
      expect(res.headers['x-ratelimit-limit']).toBeUndefined();
      expect(res.text).toMatch(/^# HELP ratelimit_decisions_total /m);
      return [...res.text.matchAll(/^ratelimit_decisions_total\{([^}]*)\} (\d+)/gm)].map(([, labels, value]) => ({
        labels: Object.fromEntries([...labels.matchAll(/(\w+)="([^"]*)"/g)].map(([, key, v]) => [key, v])),
        value: Number(value),
      }));
    };
    const total = (series: Awaited<ReturnType<typeof scrape>>) => series.reduce((sum, { value }) => sum + value, 0);
    const before = await scrape();
    for (let i = 0; i < 4; i++) await http().post('/auth/login').send({ username: 'metrics' });
    const after = await scrape();
    // One policy on the login route: one decision per request, whatever its outcome; the scrapes add none.
    expect(total(after) - total(before)).toBe(4);
    const login = after.filter(({ labels }) => labels.ratelimit_scope === 'AuthController.login');
    expect(login.length).toBeGreaterThan(0);
    for (const { labels } of after) {
      // The exporter names the instrumentation scope (the library's meter); the rest are the library's bounded labels.
      expect(labels.otel_scope_name).toBe('nest-redis-rate-limit');
      expect(
        Object.keys(labels)
          .filter((key) => !key.startsWith('otel_scope_'))
          .sort(),
      ).toEqual(['ratelimit_outcome', 'ratelimit_scope', 'ratelimit_source']);
      expect(['allowed', 'denied', 'shadow-denied']).toContain(labels.ratelimit_outcome);
      expect(['store', 'cache', 'local', 'open', 'closed']).toContain(labels.ratelimit_source);
    }
  });

  it('meters account exports through BucketService: 3, then a refusal with the wait', async () => {
    expect((await http().get('/accounts/7/exports').expect(200)).body).toMatchObject({ allowed: true, remaining: 3 });
    for (let i = 0; i < 3; i++) expect((await http().post('/accounts/7/exports').expect(201)).body.started).toBe(true);
    const refused = (await http().post('/accounts/7/exports').expect(201)).body;
    expect(refused.started).toBe(false);
    expect(refused.retryAfterSeconds).toBeGreaterThan(590);
  });

  // The partner client (apps/gateway/src/partner.client.ts): GET /api/partner calls the fake partner
  // through a method with @Paced({ capacity: 5, refillPerSecond: 5, maxWaitMs: 3000 }).
  it('GET /api/partner: 12 concurrent requests reach the partner never more than 5 + 5·t + 1 in any window, the last after 1.4 s', async () => {
    const partner = app.get(FakePartner);
    const before = partner.arrivals.length;
    const started = performance.now();
    const responses = await Promise.all(Array.from({ length: 12 }, () => http().get('/api/partner')));
    expect(responses.map((r) => r.status)).toEqual(Array(12).fill(200));
    const arrivals = partner.arrivals.slice(before);
    expect(arrivals).toHaveLength(12);
    // Every window [arrivals[i], arrivals[j]]: j - i + 1 calls in t = its length; +1 for a timer's ms.
    for (let i = 0; i < arrivals.length; i++) {
      for (let j = i; j < arrivals.length; j++) expect(j - i + 1).toBeLessThanOrEqual(5 + (5 * (arrivals[j] - arrivals[i])) / 1000 + 1);
    }
    // Paced, not just spread: the 7 calls beyond the burst of 5 come at 5/s, the last 1.4 s after the first turn.
    expect(arrivals[11] - started).toBeGreaterThanOrEqual(1400 - 2);
    expect(arrivals[11] - started).toBeLessThan(1400 + 600);
  });

  it('GET /api/partner answers 503 with Retry-After at once, without calling the partner, when its turn is over 3 s away', async () => {
    const partner = app.get(FakePartner);
    const before = partner.arrivals.length;
    // Others hold 4 s of the partner's pace (20 tokens at 5/s); aborted, they give it back.
    const others = new AbortController();
    const policy = { capacity: 5, refillPerSecond: 5 };
    const held = Array.from({ length: 4 }, () =>
      app
        .get(BucketService)
        .acquire('partner-api', policy, { cost: 5, signal: others.signal })
        .catch((error: Error) => error),
    );
    await new Promise((resolve) => setTimeout(resolve, 50));
    const started = performance.now();
    const response = await http().get('/api/partner');
    expect(performance.now() - started).toBeLessThan(500);
    others.abort();
    // Those still waiting were aborted (the first may have gone ahead had the bucket refilled meanwhile).
    expect((await Promise.all(held)).filter((r) => r instanceof Error && r.name === 'AbortError').length).toBeGreaterThanOrEqual(3);
    expect(response.status).toBe(503);
    expect(Number(response.headers['retry-after'])).toBeGreaterThanOrEqual(4);
    expect(partner.arrivals.length).toBe(before);
  });
});

describe.each(PLATFORMS)('demo gateway without Redis on %s', (platform) => {
  let app: INestApplication;

  beforeAll(async () => {
    process.env.REDIS_URL = `redis://127.0.0.1:${await freePort()}`;
    app = await createApp(AppModule, platform);
  });

  afterAll(async () => {
    await app.close();
    delete process.env.REDIS_URL;
    delete process.env.REDIS_URL_RESOLVED;
  });

  it('starts on the in-process store and still limits', async () => {
    for (let i = 0; i < 5; i++) await request(app.getHttpServer()).post('/auth/login').expect(401);
    await request(app.getHttpServer()).post('/auth/login').expect(429);
  });
});
