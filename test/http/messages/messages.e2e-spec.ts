import { type INestApplication, Module } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { Redis } from 'ioredis';
import request from 'supertest';
import { BucketService, RateLimitModule, RateLimitUnavailableError } from 'nest-redis-rate-limit';
import { createApp, PLATFORMS } from '../../support/app.js';
import { deleteKeys, freePort, redisUrl, testPrefix } from '../../support/redis.js';
import { MessagesController } from './messages.controller.js';

function appModule(redis: string, keyPrefix: string) {
  @Module({
    imports: [RateLimitModule.forRoot({ redis, keyPrefix, failureMode: 'closed', timeoutMs: 100 })],
    controllers: [MessagesController],
  })
  class MessagesAppModule {}
  return MessagesAppModule;
}

describe('option errors keep a string in quotes', () => {
  it('says (got "200") for timeoutMs given as the string "200"', async () => {
    const compiled = Test.createTestingModule({
      imports: [RateLimitModule.forRoot({ timeoutMs: '200' as unknown as number })],
    })
      .setLogger({ log() {}, warn() {}, error() {} })
      .compile();
    await expect(compiled).rejects.toThrow('RateLimitModule: timeoutMs must be a finite number > 0 (got "200")');
  });
});

describe('BucketService in failureMode closed, with Redis unreachable', () => {
  it('rejects with RateLimitUnavailableError, a ServiceUnavailableException (503) that keeps its name', async () => {
    const moduleRef = await Test.createTestingModule({
      imports: [RateLimitModule.forRoot({ redis: `redis://127.0.0.1:${await freePort()}`, failureMode: 'closed', timeoutMs: 50 })],
    })
      .setLogger({ log() {}, warn() {}, error() {} })
      .compile();
    await moduleRef.init();
    try {
      const error = await moduleRef
        .get(BucketService)
        .consume('unavailable', { capacity: 1, refillPerSecond: 1 })
        .catch((e: unknown) => e);
      expect(error).toBeInstanceOf(RateLimitUnavailableError);
      const { ServiceUnavailableException } = await import('@nestjs/common');
      expect(error).toBeInstanceOf(ServiceUnavailableException);
      const unavailable = error as RateLimitUnavailableError;
      expect(unavailable.name).toBe('RateLimitUnavailableError');
      expect(unavailable.message).toBe('Rate limiting is unavailable; try again shortly');
      expect(unavailable.getStatus()).toBe(503);
      expect((unavailable.cause as Error).message).toBe('rate-limit store unavailable: failureMode is closed');
    } finally {
      await moduleRef.close();
    }
  });
});

describe.each(PLATFORMS)('messages on %s', (platform) => {
  describe('a controller that calls BucketService.consume() while Redis is unreachable', () => {
    let app: INestApplication;
    beforeAll(async () => {
      app = await createApp(appModule(`redis://127.0.0.1:${await freePort()}`, testPrefix('messages-dead')), platform);
    });
    afterAll(async () => {
      await app?.close();
    });

    it('answers 503 Service Unavailable, not 500', async () => {
      const response = await request(app.getHttpServer()).get('/messages/export');
      expect(response.status).toBe(503);
      expect(response.body).toEqual({
        statusCode: 503,
        message: 'Rate limiting is unavailable; try again shortly',
        error: 'Service Unavailable',
      });
    });
  });

  describe('a request refused by one of two policies', () => {
    const prefix = testPrefix(`messages-${platform}`);
    let client: Redis;
    let app: INestApplication;
    beforeAll(async () => {
      const url = await redisUrl();
      client = new Redis(url);
      app = await createApp(appModule(url, prefix), platform);
    });
    afterAll(async () => {
      await app?.close();
      await deleteKeys(client, prefix);
      client?.disconnect();
    });

    it('describes the policy that refused in its headers, not the one that had tokens', async () => {
      for (let i = 0; i < 3; i++) expect((await request(app.getHttpServer()).get('/messages/two-policies')).status).toBe(200);
      const refused = await request(app.getHttpServer()).get('/messages/two-policies');
      expect(refused.status).toBe(429);
      // 'slow' refused (limit 3, nothing left, next token within 1 s); 'fast' (limit 2) had its token.
      expect(refused.headers['x-ratelimit-limit']).toBe('3');
      expect(refused.headers['x-ratelimit-remaining']).toBe('0');
      expect(refused.headers['ratelimit-limit']).toBe('3');
      expect(refused.headers['retry-after']).toBe('1');
      expect(refused.body).toEqual({ statusCode: 429, message: 'Too Many Requests', retryAfter: 1 });
    });

    it('gives retryAfterSeconds 0 in a denied consumeAll() to the buckets that had their tokens', async () => {
      const buckets = app.get(BucketService);
      const roomy = { name: 'messages-roomy', policy: { capacity: 100, refillPerSecond: 1 } };
      const tight = { name: 'messages-tight', policy: { capacity: 1, refillPerSecond: 0.1 } };
      expect((await buckets.consumeAll([roomy, tight])).allowed).toBe(true);
      const denied = await buckets.consumeAll([roomy, tight]);
      expect(denied.allowed).toBe(false);
      expect(denied.decisions[0]).toMatchObject({ allowed: false, limit: 100, remaining: 99, retryAfterSeconds: 0 });
      expect(denied.decisions[1]).toMatchObject({ allowed: false, limit: 1, remaining: 0, retryAfterSeconds: 10 });
    });
  });
});
