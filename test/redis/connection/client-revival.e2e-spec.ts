import { Test, type TestingModule } from '@nestjs/testing';
import type { Redis } from 'ioredis';
import { BucketService, BucketStore, RateLimitModule, type RedisBucketStore } from 'nest-redis-rate-limit';
import { sleep } from '../../support/load.js';
import { LogRecorder } from '../../support/log-recorder.js';
import { RedisServer } from '../../support/redis.js';

/**
 * ioredis can end a client for good (status `end`), e.g. when a disconnect cuts a Sentinel lookup
 * short. The module connects its own client again; with a retryStrategy of the application's own, it
 * leaves the choice to it. Here the end is forced with `disconnect()` on the module's client.
 */
const policy = { capacity: 10, refillPerSecond: 0.001 };

async function started(redis: unknown, recorder: LogRecorder): Promise<TestingModule> {
  const moduleRef = await Test.createTestingModule({
    imports: [RateLimitModule.forRoot({ redis: redis as string, failureMode: 'closed' })],
  })
    .setLogger(recorder)
    .compile();
  await moduleRef.init();
  return moduleRef;
}

const clientOf = (moduleRef: TestingModule) => (moduleRef.get(BucketStore) as RedisBucketStore).client as Redis;

describe('a client the module created that ioredis ends', () => {
  let server: RedisServer;
  beforeAll(async () => (server = await RedisServer.start()));
  afterAll(() => server?.stop());

  it('is connected again, without a restart, and the warning says so', async () => {
    const recorder = new LogRecorder();
    const moduleRef = await started(server.url, recorder);
    try {
      const buckets = moduleRef.get(BucketService);
      expect((await buckets.consume('revival', policy)).remaining).toBe(9);
      const ended = new Promise((resolve) => clientOf(moduleRef).once('end', resolve));
      clientOf(moduleRef).disconnect();
      await ended;
      await expect(buckets.consume('revival', policy)).rejects.toThrow(/unavailable/);
      let remaining: number | undefined;
      const deadline = Date.now() + 3000;
      while (remaining === undefined && Date.now() < deadline) {
        remaining = await buckets.consume('revival', policy).then(
          (d) => d.remaining,
          () => sleep(20).then(() => undefined),
        );
      }
      expect(remaining).toBe(8);
      expect(recorder.of('RateLimit', 'warn').join('\n')).toMatch(/ended: ioredis stopped reconnecting.*connects it again in 100 ms/);
    } finally {
      await moduleRef.close();
    }
    // Closed: the module's own end is not undone.
    await sleep(300);
    expect(clientOf(moduleRef).status).toBe('end');
  });

  it('is left ended when the application gave its own retryStrategy, and the warnings say whose choice it is', async () => {
    const recorder = new LogRecorder();
    const moduleRef = await started({ host: '127.0.0.1', port: server.port, retryStrategy: () => null }, recorder);
    try {
      clientOf(moduleRef).disconnect();
      await sleep(400);
      expect(clientOf(moduleRef).status).toBe('end');
      expect(recorder.of('RateLimit', 'warn').join('\n')).not.toMatch(/connects it again/);
    } finally {
      await moduleRef.close();
    }
  });
});
