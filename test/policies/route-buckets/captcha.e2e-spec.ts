import { type INestApplication, Module } from '@nestjs/common';
import { Redis } from 'ioredis';
import request from 'supertest';
import { RateLimitModule } from 'nest-redis-rate-limit';
import { createApp, PLATFORMS } from '../../support/app.js';
import { deleteKeys, redisUrl, testPrefix } from '../../support/redis.js';
import { AuthController } from './captcha.controller.js';

/** The README's captcha snippet: five login attempts per IP, all five back after a solved captcha. */
describe.each(PLATFORMS)('the README captcha reset on %s', (platform) => {
  const prefix = testPrefix(`route-buckets-captcha-${platform}`);
  let client: Redis;
  let app: INestApplication;

  beforeAll(async () => {
    const url = await redisUrl();
    client = new Redis(url);
    @Module({ imports: [RateLimitModule.forRoot({ redis: url, keyPrefix: prefix })], controllers: [AuthController] })
    class CaptchaAppModule {}
    app = await createApp(CaptchaAppModule, platform);
  });

  afterAll(async () => {
    await app?.close();
    await deleteKeys(client, prefix);
    client?.disconnect();
  });

  const login = () => request(app.getHttpServer()).post('/auth/login');

  it('refuses the sixth attempt, and allows five more after the captcha', async () => {
    const statuses: number[] = [];
    for (let i = 0; i < 6; i++) statuses.push((await login()).status);
    expect(statuses).toEqual([201, 201, 201, 201, 201, 429]);

    await request(app.getHttpServer()).post('/auth/captcha').send({ answer: 'wrong' }).expect(400);
    await login().expect(429);

    const solved = await request(app.getHttpServer()).post('/auth/captcha').send({ answer: 'expected' }).expect(201);
    expect(solved.body).toEqual({ allowed: true, limit: 5, remaining: 5, retryAfterSeconds: 0, resetSeconds: 0 });
    statuses.length = 0;
    for (let i = 0; i < 6; i++) statuses.push((await login()).status);
    expect(statuses).toEqual([201, 201, 201, 201, 201, 429]);
  });
});
