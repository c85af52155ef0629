import { type INestApplication, Logger, Module } from '@nestjs/common';
import { JwtService } from '@nestjs/jwt';
import { Redis } from 'ioredis';
import request from 'supertest';
import { RateLimitModule } from 'nest-redis-rate-limit';
import { createApp, PLATFORMS } from '../../support/app.js';
import { LogRecorder } from '../../support/log-recorder.js';
import { deleteKeys, keysUnder, redisUrl, testPrefix, tokensOf } from '../../support/redis.js';
import { AuthModule, USERS } from './auth.js';
import { LoginController, OpenController, ProfileController } from './identity.controllers.js';

/**
 * Who is limited in an app with real passport strategies: user-keyed policies see the user the app's
 * own guards set (they are decided after them), IP-keyed ones count what those guards refuse.
 */
describe.each(PLATFORMS)('identities behind passport guards on %s', (platform) => {
  const prefix = testPrefix(`identity-${platform}`);
  const recorder = new LogRecorder();
  let client: Redis;
  let app: INestApplication;
  let tokens: Record<string, string>;

  beforeAll(async () => {
    client = new Redis(await redisUrl());
    @Module({
      imports: [AuthModule, RateLimitModule.forRoot({ redis: await redisUrl(), keyPrefix: prefix })],
      controllers: [LoginController, ProfileController, OpenController],
    })
    class IdentityAppModule {}
    app = await createApp(IdentityAppModule, platform);
    Logger.overrideLogger(recorder);
    const jwt = app.get(JwtService);
    tokens = Object.fromEntries(Object.keys(USERS).map((id) => [id, jwt.sign({ sub: id })]));
  });

  afterAll(async () => {
    Logger.overrideLogger(false);
    await app.close();
    await deleteKeys(client, prefix);
    await client.quit();
  });

  const asUser = (path: string, user: string) => request(app.getHttpServer()).get(path).set('authorization', `Bearer ${tokens[user]}`);
  const tokensAt = (key: string) => tokensOf(client, key);

  it('gives alice, bob and carol a bucket each behind a controller-level AuthGuard("jwt")', async () => {
    const remaining: string[] = [];
    for (const user of ['alice', 'bob', 'carol']) {
      const response = await asUser('/me', user).expect(200);
      expect(response.body).toEqual({ id: user });
      remaining.push(response.headers['x-ratelimit-remaining']);
    }
    expect(remaining).toEqual(['4', '4', '4']);
    const keys = await keysUnder(client, prefix);
    for (const user of ['alice', 'bob', 'carol']) expect(keys).toContain(`${prefix}{user:${user}}:ProfileController.profile`);
    expect(keys.filter((key) => key.includes('{ip:'))).toEqual([]);
  });

  it('charges nothing for requests the auth guard refuses on a user-keyed route', async () => {
    await request(app.getHttpServer()).get('/me').expect(401);
    await request(app.getHttpServer()).get('/me').set('authorization', 'Bearer not-a-token').expect(401);
    expect((await asUser('/me', 'alice').expect(200)).headers['x-ratelimit-remaining']).toBe('3');
  });

  it('counts login attempts that passport-local refuses, then refuses even the right password with 429', async () => {
    const login = (password: string) => request(app.getHttpServer()).post('/auth/login').send({ username: 'alice', password });
    for (let attempt = 0; attempt < 3; attempt++) await login('guess').expect(401);
    const refused = await login(USERS.alice).expect(429);
    expect(Number(refused.headers['retry-after'])).toBeGreaterThanOrEqual(1);
    expect(refused.headers['x-ratelimit-remaining']).toBe('0');
    expect(refused.body).toMatchObject({ statusCode: 429, retryAfter: Number(refused.headers['retry-after']) });
    expect(await tokensAt(`${prefix}{ip:127.0.0.1}:LoginController.login`)).toBeLessThan(1);
  });

  it('gives the per-IP token back when the per-user quota refuses, so the next user still gets in', async () => {
    const ipKey = `${prefix}{ip:127.0.0.1}:me-ip`;
    const allowed = await asUser('/me/both', 'bob').expect(200);
    // Headers describe the most restrictive policy: the user bucket (2 - 1 = 1 left) over the IP one (3 - 1).
    expect(allowed.headers['x-ratelimit-limit']).toBe('2');
    expect(allowed.headers['x-ratelimit-remaining']).toBe('1');
    await asUser('/me/both', 'bob').expect(200);
    const refused = await asUser('/me/both', 'bob').expect(429);
    expect(refused.headers['x-ratelimit-limit']).toBe('2');
    expect(refused.headers['x-ratelimit-remaining']).toBe('0');
    // Two requests drained the IP bucket to 1; the refused one took a token and gave it back.
    const ipTokens = await tokensAt(ipKey);
    expect(ipTokens).toBeGreaterThanOrEqual(1);
    expect(ipTokens).toBeLessThan(1.1);
    expect(await tokensAt(`${prefix}{user:bob}:me-user`)).toBeLessThan(1);
    await asUser('/me/both', 'carol').expect(200);
    expect(await tokensAt(ipKey)).toBeLessThan(0.1);
    await asUser('/me/both', 'alice').expect(429);
  });

  it('limits a user-keyed route without a user by IP, and says so once for the route', async () => {
    recorder.clear();
    await request(app.getHttpServer()).get('/open/user').expect(200);
    await request(app.getHttpServer()).get('/open/user').expect(200);
    await request(app.getHttpServer()).get('/open/user').expect(429);
    expect(await keysUnder(client, `${prefix}{ip:127.0.0.1}:OpenController.user`)).toHaveLength(1);
    const warnings = recorder.of('RateLimit', 'warn');
    expect(warnings).toHaveLength(1);
    expect(warnings[0]).toContain("keyBy 'user' on OpenController.user");
    expect(warnings[0]).toContain('found no user');
    expect(warnings[0]).toContain('limited by IP');
  });
});
