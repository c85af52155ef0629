import { type INestApplication, Logger } from '@nestjs/common';
import { Redis } from 'ioredis';
import request from 'supertest';
import { apiKeyIdentity } from '../../../libs/rate-limit/src/keys/identity-keys.js';
import type { RateLimitModuleOptions } from 'nest-redis-rate-limit';
import { createApp, PLATFORMS, type Platform, type PlatformOptions } from '../../support/app.js';
import { LogRecorder } from '../../support/log-recorder.js';
import { deleteKeys, keysUnder, redisUrl, testPrefix, tokensOf } from '../../support/redis.js';
import {
  BadClassSkipController,
  BadSkipController,
  DefaultsSkipController,
  NamedSkipController,
  SKIP_CONTROLLERS,
  SkippedController,
  skipsAppModule,
} from './skips.controllers.js';

/**
 * Skips (issue 12, item 4): module and policy `skipIf`, `@SkipRateLimit('name')`, and the module
 * allow-list of addresses and identities, against the shared Redis on both platforms.
 */
describe.each(PLATFORMS)('skips on %s', (platform: Platform) => {
  const prefix = testPrefix(`skips-${platform}`);
  const recorder = new LogRecorder();
  let client: Redis;
  const apps: INestApplication[] = [];
  let started = 0;

  /** Starts an app on a port of its own (127.0.0.1); returns its URL and its key prefix. */
  async function start(
    options: RateLimitModuleOptions = {},
    controllers: Function[] = SKIP_CONTROLLERS,
    platformOptions: PlatformOptions = {},
  ): Promise<{ url: string; keyPrefix: string }> {
    const keyPrefix = `${prefix}${started++}:`;
    const module = skipsAppModule({ redis: await redisUrl(), keyPrefix, ...options }, controllers);
    const app = await createApp(module, platform, undefined, platformOptions);
    apps.push(app);
    await app.listen(0, '127.0.0.1');
    // Compiling a testing module installs its own logger: the recorder goes in after.
    Logger.overrideLogger(recorder);
    recorder.clear();
    return { url: await app.getUrl(), keyPrefix };
  }

  /** Whether the response carries any rate-limit header. */
  const hasHeaders = (response: request.Response) =>
    Object.keys(response.headers).some((name) => /^(x-)?ratelimit|^retry-after$/.test(name));

  /** `n` sequential GETs; their statuses. */
  async function statuses(n: number, call: () => request.Test): Promise<number[]> {
    const found: number[] = [];
    for (let i = 0; i < n; i++) found.push((await call()).status);
    return found;
  }

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

  describe('module skipIf', () => {
    const health = (context: import('@nestjs/common').ExecutionContext) => {
      const value = context.switchToHttp().getRequest().headers['x-health'];
      if (value === 'throw') throw new Error('health check lookup failed');
      if (value === 'hang') return new Promise<boolean>(() => undefined);
      return value === '1';
    };

    it('decides no policy for a request it answers true for: no headers, no bucket written', async () => {
      const { url, keyPrefix } = await start({ skipIf: health });
      for (let i = 0; i < 5; i++) {
        const response = await request(url).get('/s/ip').set('x-health', '1').expect(200);
        expect(hasHeaders(response)).toBe(false);
      }
      expect(await keysUnder(client, keyPrefix)).toEqual([]);
      // The others are limited as usual, from a full bucket.
      const first = await request(url).get('/s/ip').expect(200);
      expect(first.headers['x-ratelimit-limit']).toBe('2');
      expect(first.headers['x-ratelimit-remaining']).toBe('1');
      await request(url).get('/s/ip').expect(200);
      await request(url).get('/s/ip').expect(429);
      // Still skipped once the bucket is empty.
      expect(hasHeaders(await request(url).get('/s/ip').set('x-health', '1').expect(200))).toBe(false);
    });

    it('runs again after the app guards, where it sees req.user: the per-IP policy decided before is kept', async () => {
      const calls: Array<string | undefined> = [];
      const { url, keyPrefix } = await start({
        skipIf: (context) => {
          const user = context.switchToHttp().getRequest().user?.id;
          calls.push(user);
          return user === 'admin';
        },
      });
      const response = await request(url).get('/s/two-phase').set('x-user', 'admin').expect(200);
      // One call per phase: before the auth guard (no user yet), after it (admin).
      expect(calls).toEqual([undefined, 'admin']);
      // Only the IP policy (3) was decided: the headers describe it.
      expect(response.headers['x-ratelimit-limit']).toBe('3');
      expect(response.headers['x-ratelimit-remaining']).toBe('2');
      await request(url).get('/s/two-phase').set('x-user', 'admin').expect(200);
      await request(url).get('/s/two-phase').set('x-user', 'admin').expect(200);
      // The IP bucket refuses the 4th: skipIf in phase 2 does not undo phase 1.
      await request(url).get('/s/two-phase').set('x-user', 'admin').expect(429);
      const keys = await keysUnder(client, keyPrefix);
      expect(keys).toEqual([`${keyPrefix}{ip:127.0.0.1}:tp-ip`]);
      expect(await tokensOf(client, `${keyPrefix}{ip:127.0.0.1}:tp-ip`)).toBeLessThan(0.05);
    });

    it.each(['throw', 'hang'])('skips nothing when it fails (%s), and says so', async (failure) => {
      const { url, keyPrefix } = await start({ skipIf: health, timeoutMs: 150 });
      expect(await statuses(3, () => request(url).get('/s/ip').set('x-health', failure))).toEqual([200, 200, 429]);
      expect(await tokensOf(client, `${keyPrefix}{ip:127.0.0.1}:ip2`)).toBeLessThan(0.05);
      const warnings = recorder.of('RateLimit', 'warn').filter((line) => line.startsWith('skipIf (module)'));
      expect(warnings).toHaveLength(1);
      expect(warnings[0]).toContain(failure === 'throw' ? 'threw (health check lookup failed)' : 'did not answer within timeoutMs');
      expect(warnings[0]).toContain('the policy is applied');
    });
  });

  describe('policy skipIf', () => {
    it('leaves that policy out of the request; the others decide, all or nothing among themselves', async () => {
      const { url, keyPrefix } = await start();
      const a = `${keyPrefix}{ip:127.0.0.1}:ps-a`;
      const b = `${keyPrefix}{ip:127.0.0.1}:ps-b`;
      const skipped = await request(url).get('/s/policy-skip').set('x-skip-a', '1').expect(200);
      // Only b (3) decided: the headers describe b, and a's bucket is never written.
      expect(skipped.headers['x-ratelimit-limit']).toBe('3');
      expect(skipped.headers['x-ratelimit-remaining']).toBe('2');
      await request(url).get('/s/policy-skip').set('x-skip-a', '1').expect(200);
      expect(await client.exists(a)).toBe(0);
      expect(await tokensOf(client, b)).toBeCloseTo(1, 1);
      // Both decide: a takes 1 of 2, b its last token; b, with the fewest left, describes the response.
      const both = await request(url).get('/s/policy-skip').expect(200);
      expect(both.headers['x-ratelimit-limit']).toBe('3');
      expect(both.headers['x-ratelimit-remaining']).toBe('0');
      // b is empty: refused with or without a, and a's remaining token is kept (all or nothing).
      await request(url).get('/s/policy-skip').expect(429);
      await request(url).get('/s/policy-skip').set('x-skip-a', '1').expect(429);
      const aTokens = await tokensOf(client, a);
      expect(aTokens).toBeGreaterThanOrEqual(1);
      expect(aTokens).toBeLessThan(1.05);
      expect(await tokensOf(client, b)).toBeLessThan(0.05);
    });

    it.each(['throw', 'hang'])('applies the policy when its skipIf fails (%s), and says so', async (failure) => {
      const { url, keyPrefix } = await start({ timeoutMs: 150 });
      const first = await request(url).get('/s/policy-skip').set('x-skip-a', failure).expect(200);
      expect(first.headers['x-ratelimit-limit']).toBe('2');
      expect(await statuses(2, () => request(url).get('/s/policy-skip').set('x-skip-a', failure))).toEqual([200, 429]);
      expect(await tokensOf(client, `${keyPrefix}{ip:127.0.0.1}:ps-a`)).toBeLessThan(0.05);
      const warnings = recorder.of('RateLimit', 'warn').filter((line) => line.startsWith('skipIf of ps-a'));
      expect(warnings).toHaveLength(1);
      expect(warnings[0]).toContain(failure === 'throw' ? 'threw (skipIf of policy a failed)' : 'did not answer within timeoutMs');
    });
  });

  describe('@SkipRateLimit(name)', () => {
    it('on a handler, leaves out only the policies of that name', async () => {
      const { url, keyPrefix } = await start();
      const results = [];
      for (let i = 0; i < 4; i++) results.push(await request(url).get('/s/named'));
      // burst (2) would have refused the 3rd: only quota (3) decides.
      expect(results.map((r) => r.status)).toEqual([200, 200, 200, 429]);
      expect(results[0].headers['x-ratelimit-limit']).toBe('3');
      expect(results[0].headers['x-ratelimit-remaining']).toBe('2');
      expect(await keysUnder(client, keyPrefix)).toEqual([`${keyPrefix}{ip:127.0.0.1}:quota`]);
    });

    it('naming every policy of the handler leaves the route unlimited', async () => {
      const { url, keyPrefix } = await start();
      for (let i = 0; i < 5; i++) expect(hasHeaders(await request(url).get('/s/named-both').expect(200))).toBe(false);
      expect(await keysUnder(client, keyPrefix)).toEqual([]);
    });

    it('skips a module default by name', async () => {
      const { url, keyPrefix } = await start(
        {
          defaults: [
            { capacity: 2, refillPerSecond: 0.001, name: 'd-burst' },
            { capacity: 3, refillPerSecond: 0.001, name: 'd-quota' },
          ],
        },
        [DefaultsSkipController],
      );
      expect(await statuses(4, () => request(url).get('/d'))).toEqual([200, 200, 200, 429]);
      expect(await keysUnder(client, keyPrefix)).toEqual([`${keyPrefix}{ip:127.0.0.1}:d-quota`]);
    });

    it('on a controller, leaves that name out of every handler (its own policies included); @SkipRateLimit() still skips all', async () => {
      const { url, keyPrefix } = await start();
      const plain = await request(url).get('/c/plain').expect(200);
      expect(plain.headers['x-ratelimit-limit']).toBe('3');
      expect(await statuses(3, () => request(url).get('/c/plain'))).toEqual([200, 200, 429]);
      const own = await request(url).get('/c/own').expect(200);
      expect(own.headers['x-ratelimit-limit']).toBe('5');
      expect(own.headers['x-ratelimit-remaining']).toBe('4');
      for (let i = 0; i < 4; i++) expect(hasHeaders(await request(url).get('/c/all').expect(200))).toBe(false);
      expect(await keysUnder(client, keyPrefix)).toEqual([`${keyPrefix}{ip:127.0.0.1}:own`, `${keyPrefix}{ip:127.0.0.1}:quota`]);
    });

    it('@SkipRateLimit(false) on a handler undoes @SkipRateLimit() on its controller', async () => {
      const { url } = await start({}, [SkippedController]);
      for (let i = 0; i < 4; i++) expect(hasHeaders(await request(url).get('/off/skipped').expect(200))).toBe(false);
      const first = await request(url).get('/off/undone').expect(200);
      expect(first.headers['x-ratelimit-limit']).toBe('2');
      expect(await statuses(2, () => request(url).get('/off/undone'))).toEqual([200, 429]);
    });

    it('naming no policy of the handler stops the start, naming the route and its policies', async () => {
      // The memory store: an app that fails to start leaves no Redis connection behind.
      const options = { store: 'memory' as const, keyPrefix: `${prefix}bad:` };
      await expect(createApp(skipsAppModule(options, [BadSkipController]), platform)).rejects.toThrow(
        "@SkipRateLimit('nope') on BadSkipController.typo: no policy of that name applies there (its policies: burst)",
      );
      expect(await keysUnder(client, `${prefix}bad:`)).toEqual([]);
    });

    it('a controller-level name that no policy of any of its handlers has stops the start too, naming the class and what applies', async () => {
      const options = { store: 'memory' as const, keyPrefix: `${prefix}bad-class:` };
      await expect(createApp(skipsAppModule(options, [BadClassSkipController]), platform)).rejects.toThrow(
        "@SkipRateLimit('brust') on BadClassSkipController: no policy of that name applies to any of its handlers " +
          '(their policies: burst, quota, own)',
      );
    });

    it('a controller-level name that one handler has and another does not is accepted (NamedSkipController: /c/all skips all)', async () => {
      const { url } = await start({}, [NamedSkipController]);
      await request(url).get('/c/plain').expect(200);
    });
  });

  describe('allowList.ips', () => {
    const ips = ['10.0.0.0/8', '192.0.2.7', '2001:db8::/32', '::1'];
    const from = (url: string, path: string, address: string) => request(url).get(path).set('x-forwarded-for', address);

    it('decides nothing for a listed address or range (v4, v6, IPv4-mapped), behind a trusted proxy', async () => {
      const { url, keyPrefix } = await start({ allowList: { ips } }, SKIP_CONTROLLERS, { trustProxy: true });
      for (const address of ['10.1.2.3', '10.255.0.1', '::ffff:10.1.2.3', '192.0.2.7', '2001:db8:1::5', '::1']) {
        for (let i = 0; i < 4; i++) {
          const response = await from(url, '/s/ip', address).expect(200);
          expect(hasHeaders(response)).toBe(false);
        }
      }
      expect(await keysUnder(client, keyPrefix)).toEqual([]);
      // Next to them, unlisted addresses are limited (capacity 2).
      for (const address of ['11.0.0.1', '192.0.2.8', '2001:db9::1']) {
        const first = await from(url, '/s/ip', address).expect(200);
        expect(first.headers['x-ratelimit-remaining']).toBe('1');
        expect(await statuses(2, () => from(url, '/s/ip', address))).toEqual([200, 429]);
      }
      expect(await keysUnder(client, keyPrefix)).toEqual(
        [`${keyPrefix}{ip:11.0.0.1}:ip2`, `${keyPrefix}{ip:192.0.2.8}:ip2`, `${keyPrefix}{ip:2001:db9:0:0::}:ip2`].sort(),
      );
    });

    it('exempts the whole request: the policies after the app guards too', async () => {
      const { url, keyPrefix } = await start({ allowList: { ips } }, SKIP_CONTROLLERS, { trustProxy: true });
      for (let i = 0; i < 5; i++) {
        const response = await from(url, '/s/two-phase', '10.9.9.9').set('x-user', 'ann').expect(200);
        expect(hasHeaders(response)).toBe(false);
      }
      expect(await keysUnder(client, keyPrefix)).toEqual([]);
      // Another address, same user: the user's bucket (2) is full, the IP's too.
      expect(await statuses(3, () => from(url, '/s/two-phase', '11.0.0.1').set('x-user', 'ann'))).toEqual([200, 200, 429]);
    });

    it('reads the address the platform gives: X-Forwarded-For is not trusted without trustProxy', async () => {
      const { url, keyPrefix } = await start({ allowList: { ips } });
      expect(await statuses(3, () => from(url, '/s/ip', '10.1.2.3'))).toEqual([200, 200, 429]);
      expect(await keysUnder(client, keyPrefix)).toEqual([`${keyPrefix}{ip:127.0.0.1}:ip2`]);
    });

    it('exempts the loopback client when 127.0.0.0/8 is listed (no proxy)', async () => {
      const { url } = await start({ allowList: { ips: ['127.0.0.0/8'] } });
      for (let i = 0; i < 4; i++) expect(hasHeaders(await request(url).get('/s/ip').expect(200))).toBe(false);
    });

    it.each(['10.0.0.0/33', 'nope', '2001:db8::/129', '10.0.0.0/8/8', ''])('refuses to start with the invalid entry %j', async (entry) => {
      const options = { redis: await redisUrl(), keyPrefix: `${prefix}invalid:`, allowList: { ips: ['10.0.0.0/8', entry] } };
      await expect(createApp(skipsAppModule(options), platform)).rejects.toThrow(
        `RateLimitModule: allowList.ips has an invalid entry ${JSON.stringify(entry)}`,
      );
    });
  });

  describe('allowList.users and allowList.apiKeys', () => {
    it('skips the policies keyed by a listed user; the per-IP policy of the route still applies', async () => {
      const { url, keyPrefix } = await start({ allowList: { users: ['svc', 42] } });
      const first = await request(url).get('/s/two-phase').set('x-user', 'svc').expect(200);
      // Only the IP policy (3) was decided.
      expect(first.headers['x-ratelimit-limit']).toBe('3');
      expect(first.headers['x-ratelimit-remaining']).toBe('2');
      expect(await statuses(3, () => request(url).get('/s/two-phase').set('x-user', 'svc'))).toEqual([200, 200, 429]);
      expect(await keysUnder(client, keyPrefix)).toEqual([`${keyPrefix}{ip:127.0.0.1}:tp-ip`]);
    });

    it('matches a numeric user id of the list to the user id the request gives as text', async () => {
      const { url, keyPrefix } = await start({ allowList: { users: [42] } });
      const first = await request(url).get('/s/two-phase').set('x-user', '42').expect(200);
      expect(first.headers['x-ratelimit-limit']).toBe('3');
      expect(await keysUnder(client, keyPrefix)).toEqual([`${keyPrefix}{ip:127.0.0.1}:tp-ip`]);
    });

    it('limits an unlisted user by both policies', async () => {
      const { url, keyPrefix } = await start({ allowList: { users: ['svc'] } });
      const first = await request(url).get('/s/two-phase').set('x-user', 'ann').expect(200);
      expect(first.headers['x-ratelimit-limit']).toBe('2');
      expect(first.headers['x-ratelimit-remaining']).toBe('1');
      expect(await statuses(2, () => request(url).get('/s/two-phase').set('x-user', 'ann'))).toEqual([200, 429]);
      expect(await keysUnder(client, keyPrefix)).toEqual([`${keyPrefix}{ip:127.0.0.1}:tp-ip`, `${keyPrefix}{user:ann}:tp-user`]);
    });

    it('skips the policies keyed by a listed API key; the per-IP policy still applies; other keys are limited', async () => {
      const { url, keyPrefix } = await start({ allowList: { apiKeys: ['internal-key'] } });
      const first = await request(url).get('/s/key').set('x-api-key', 'internal-key').expect(200);
      expect(first.headers['x-ratelimit-limit']).toBe('3');
      expect(first.headers['x-ratelimit-remaining']).toBe('2');
      expect(await keysUnder(client, keyPrefix)).toEqual([`${keyPrefix}{ip:127.0.0.1}:key-ip`]);
      const other = await request(url).get('/s/key').set('x-api-key', 'client-key').expect(200);
      // client-key's bucket (2) has 1 left, the IP bucket 1 too.
      expect(other.headers['x-ratelimit-limit']).toBe('2');
      expect(other.headers['x-ratelimit-remaining']).toBe('1');
      expect(await keysUnder(client, keyPrefix)).toEqual(
        [`${keyPrefix}{ip:127.0.0.1}:key-ip`, `${keyPrefix}{${apiKeyIdentity('client-key')}}:key2`].sort(),
      );
      await request(url).get('/s/key').set('x-api-key', 'internal-key').expect(200);
      // The IP bucket (3) is empty now, whatever the key.
      await request(url).get('/s/key').set('x-api-key', 'internal-key').expect(429);
    });

    it('skips the policies keyed by a listed key as keys.apiKey verifies it', async () => {
      const { url, keyPrefix } = await start({
        allowList: { apiKeys: ['tenant-internal'] },
        keys: { apiKey: (req) => (req.headers['x-api-key'] === 'secret-1' ? 'tenant-internal' : undefined) },
      });
      for (let i = 0; i < 3; i++) {
        const response = await request(url).get('/s/key').set('x-api-key', 'secret-1').expect(200);
        expect(response.headers['x-ratelimit-limit']).toBe('3');
      }
      expect(await keysUnder(client, keyPrefix)).toEqual([`${keyPrefix}{ip:127.0.0.1}:key-ip`]);
    });
  });
});

/**
 * `@SkipRateLimit(false)` on a handler "undoes its controller's skip" (the decorator's documentation):
 * a skip by name too, so the policy the controller skipped is decided again on that handler. Its own
 * app, with only `UndoNamedSkipController`.
 */
describe.each(PLATFORMS)('@SkipRateLimit(false) under a named controller skip on %s', (platform: Platform) => {
  const prefix = testPrefix(`skips-undo-named-${platform}`);
  let client: Redis;
  let app: INestApplication | undefined;

  beforeAll(async () => {
    client = new Redis(await redisUrl());
  });
  afterAll(async () => {
    await app?.close();
    await deleteKeys(client, prefix);
    await client.quit();
  });

  it('decides the policy the controller skipped by name', async () => {
    const { UndoNamedSkipController } = await import('./skips.controllers.js');
    app = await createApp(skipsAppModule({ redis: await redisUrl(), keyPrefix: prefix }, [UndoNamedSkipController]), platform);
    await app.listen(0, '127.0.0.1');
    const url = await app.getUrl();
    const first = await request(url).get('/undo-named').expect(200);
    // burst (2) and quota (3) both decide: burst has the fewest left.
    expect(first.headers['x-ratelimit-limit']).toBe('2');
    expect((await request(url).get('/undo-named')).status).toBe(200);
    expect((await request(url).get('/undo-named')).status).toBe(429);
    expect(await keysUnder(client, prefix)).toEqual([`${prefix}{ip:127.0.0.1}:burst`, `${prefix}{ip:127.0.0.1}:quota`]);
  });
});
