import type { INestApplication } from '@nestjs/common';
import { Redis } from 'ioredis';
import request from 'supertest';
import { AppModule } from '../../../apps/gateway/src/app.module.js';
import { createApp, PLATFORMS } from '../../support/app.js';
import { deleteKeys, redisUrl, testPrefix } from '../../support/redis.js';

/**
 * Issue 33, item 7: the demo gateway mounts the rate-limit dashboard at /rate-limit behind its admin auth
 * (HTTP Basic, user admin, password DASHBOARD_TOKEN), with operations on: no page and no API without
 * the password (401 and the header that makes a browser ask for it), the page and the policies with it.
 */
describe.each(PLATFORMS)('the demo gateway dashboard on %s', (platform) => {
  const prefix = testPrefix(`gateway-dashboard-${platform}`);
  const basic = (password: string) => `Basic ${Buffer.from(`admin:${password}`).toString('base64')}`;
  let app: INestApplication;

  beforeAll(async () => {
    process.env.REDIS_URL = await redisUrl();
    process.env.RATE_LIMIT_PREFIX = prefix;
    process.env.DASHBOARD_TOKEN = 'open-sesame';
    app = await createApp(AppModule, platform);
  });

  afterAll(async () => {
    await app.close();
    delete process.env.RATE_LIMIT_PREFIX;
    delete process.env.DASHBOARD_TOKEN;
    const client = new Redis(await redisUrl());
    await deleteKeys(client, prefix);
    await client.quit();
  });

  it.each([undefined, basic('wrong'), basic('open-sesame').replace('Basic', 'Bearer')])(
    'answers 401 to authorization %s, page and API alike',
    async (authorization) => {
      for (const path of ['/rate-limit', '/rate-limit/api/state']) {
        const req = request(app.getHttpServer()).get(path);
        if (authorization) req.set('authorization', authorization);
        const res = await req;
        expect(res.status).toBe(401);
        expect(res.headers['www-authenticate']).toBe('Basic realm="rate-limit dashboard", charset="UTF-8"');
        expect(res.text).not.toContain('Rate limits');
      }
    },
  );

  it('serves the page and the state with the password, operations on', async () => {
    const page = await request(app.getHttpServer()).get('/rate-limit').set('authorization', basic('open-sesame'));
    expect(page.status).toBe(200);
    expect(page.text).toContain('<title>Rate limits</title>');
    const state = await request(app.getHttpServer()).get('/rate-limit/api/state').set('authorization', basic('open-sesame'));
    expect(state.body.operations).toMatchObject({ enabled: true });
    expect(state.body.policies.map((p: { scope: string }) => p.scope)).toEqual(
      expect.arrayContaining(['HelloController.hello#0', 'api-per-ip']),
    );
  });
});
