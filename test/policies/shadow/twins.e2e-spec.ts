import type { INestApplication } from '@nestjs/common';
import { Redis } from 'ioredis';
import request from 'supertest';
import type { RateLimitDecisionEvent } from 'nest-redis-rate-limit';
import { createApp, PLATFORMS, type Platform } from '../../support/app.js';
import { deleteKeys, redisUrl, testPrefix, tokensOf } from '../../support/redis.js';
import { twinAppModule } from './twins.controllers.js';

/**
 * Issue 22, finding 5: a shadow policy (`enforce: false`) drains exactly what it would drain enforced,
 * alone or stacked, across phases, refunds included. Every scenario runs the same requests against a
 * route with the policy enforced and its twin with the policy in shadow; the shadow bucket must end
 * where the enforced one does, and its `shadow-denied` count must equal the enforced policy's own
 * refusals (events where it lacked tokens: `retryAfterSeconds` > 0).
 */
describe.each(PLATFORMS)('shadow policies drain what their enforced twin does, on %s', (platform: Platform) => {
  const prefix = testPrefix(`shadow-twins-${platform}`);
  const events: RateLimitDecisionEvent[] = [];
  let client: Redis;
  let app: INestApplication;
  let url: string;

  const ipKey = (scope: string) => `${prefix}{ip:127.0.0.1}:${scope}`;
  const userKey = (scope: string) => `${prefix}{user:u1}:${scope}`;
  /** The times `scope` refused on its own numbers: `denied` (enforced) or `shadow-denied` with a wait. */
  const ownRefusals = (scope: string) =>
    events.filter((e) => e.scope === scope && e.outcome !== 'allowed' && e.retryAfterSeconds > 0).length;
  const shadowDenied = (scope: string) => events.filter((e) => e.scope === scope && e.outcome === 'shadow-denied').length;

  async function send(path: string, n: number, query = (_i: number) => ''): Promise<number[]> {
    const statuses: number[] = [];
    for (let i = 0; i < n; i++)
      statuses.push(
        (
          await request(url)
            .get(`/twin/${path}${query(i)}`)
            .set('x-user', 'u1')
        ).status,
      );
    return statuses;
  }

  beforeAll(async () => {
    client = new Redis(await redisUrl());
    app = await createApp(twinAppModule({ redis: await redisUrl(), keyPrefix: prefix, onDecision: (e) => events.push(e) }), platform);
    await app.listen(0, '127.0.0.1');
    url = await app.getUrl();
  });
  afterAll(async () => {
    await app?.close();
    await deleteKeys(client, prefix);
    await client.quit();
  });

  it('beside a stricter enforced policy (2): 15 requests leave the policy of 10 at 8 and never shadow-denied, as enforced', async () => {
    expect(await send('stacked-enforced', 15)).toEqual([200, 200, ...Array(13).fill(429)]);
    expect(await send('stacked-shadow', 15)).toEqual([200, 200, ...Array(13).fill(429)]);
    expect(await tokensOf(client, ipKey('st-e'))).toBeCloseTo(8, 2);
    expect(await tokensOf(client, ipKey('st-s'))).toBeCloseTo(8, 2);
    expect(ownRefusals('st-e')).toBe(0);
    expect(shadowDenied('st-s')).toBe(0);
  });

  it('decided before the guards while a per-user policy (2) refuses after them: its tokens come back, 8 left as enforced', async () => {
    expect(await send('phased-enforced', 15)).toEqual([200, 200, ...Array(13).fill(429)]);
    expect(await send('phased-shadow', 15)).toEqual([200, 200, ...Array(13).fill(429)]);
    expect(await tokensOf(client, ipKey('ph-e'))).toBeCloseTo(8, 2);
    expect(await tokensOf(client, ipKey('ph-s'))).toBeCloseTo(8, 2);
    expect(shadowDenied('ph-s')).toBe(0);
  });

  it('a shadow per-user policy (2) that would refuse after the guards gives back the IP shadow policy of 10: 8 left, 3 shadow-denied', async () => {
    expect(await send('late-shadow-enforced', 5)).toEqual([200, 200, 429, 429, 429]);
    expect(await send('late-shadow', 5)).toEqual([200, 200, 200, 200, 200]);
    expect(await tokensOf(client, ipKey('ls-e'))).toBeCloseTo(8, 2);
    expect(await tokensOf(client, ipKey('ls-s'))).toBeCloseTo(8, 2);
    expect(await tokensOf(client, userKey('ls-e-user'))).toBeCloseTo(0, 2);
    expect(await tokensOf(client, userKey('ls-s-user'))).toBeCloseTo(0, 2);
    expect(ownRefusals('ls-e-user')).toBe(3);
    expect(shadowDenied('ls-s-user')).toBe(3);
    expect(shadowDenied('ls-s')).toBe(0);
  });

  it('a shadow IP policy (2) that would refuse before the guards leaves the shadow per-user policy of 10 at 8, as enforced', async () => {
    expect(await send('early-shadow-enforced', 5)).toEqual([200, 200, 429, 429, 429]);
    expect(await send('early-shadow', 5)).toEqual([200, 200, 200, 200, 200]);
    expect(await tokensOf(client, ipKey('es-e'))).toBeCloseTo(0, 2);
    expect(await tokensOf(client, ipKey('es-s'))).toBeCloseTo(0, 2);
    // The three requests phase 1 refuses never reach phase 2: only the first two drain the user's bucket.
    expect(await tokensOf(client, userKey('es-e-user'))).toBeCloseTo(8, 2);
    expect(await tokensOf(client, userKey('es-s-user'))).toBeCloseTo(8, 2);
    expect(ownRefusals('es-e')).toBe(3);
    expect(shadowDenied('es-s')).toBe(3);
    expect(shadowDenied('es-s-user')).toBe(0);
    // No event of phase 2 for the refused requests, as enforced: two decisions each.
    expect(events.filter((e) => e.scope === 'es-e-user')).toHaveLength(2);
    expect(events.filter((e) => e.scope === 'es-s-user')).toHaveLength(2);
  });

  it("refundOn 'failure': 3 failed and 3 good requests leave 2 of 5 in both buckets; the 6th good one is shadow-denied", async () => {
    // fail, ok, fail, ok, fail, ok: the three failures are given back, the three successes keep theirs.
    const query = (i: number) => (i % 2 === 0 && i < 6 ? '?fail=1' : '');
    expect(await send('refund-enforced', 6, query)).toEqual([502, 200, 502, 200, 502, 200]);
    expect(await send('refund-shadow', 6, query)).toEqual([502, 200, 502, 200, 502, 200]);
    expect(await tokensOf(client, ipKey('rf-e'))).toBeCloseTo(2, 2);
    expect(await tokensOf(client, ipKey('rf-s'))).toBeCloseTo(2, 2);
    expect(await send('refund-enforced', 3)).toEqual([200, 200, 429]);
    expect(await send('refund-shadow', 3)).toEqual([200, 200, 200]);
    expect(await tokensOf(client, ipKey('rf-s'))).toBeCloseTo(await tokensOf(client, ipKey('rf-e')), 2);
    expect(ownRefusals('rf-e')).toBe(1);
    expect(shadowDenied('rf-s')).toBe(1);
  });
});
