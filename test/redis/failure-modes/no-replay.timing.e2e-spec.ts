import { Test, type TestingModule } from '@nestjs/testing';
import { Redis } from 'ioredis';
import { BucketService, BucketStore, RateLimitModule, type RedisBucketStore } from 'nest-redis-rate-limit';
import { sleep } from '../../support/load.js';
import { keysUnder, RedisServer } from '../../support/redis.js';
import { inspector } from './scenario.js';

/**
 * README, "When Redis fails": commands in flight when the connection drops are failed, never replayed
 * after it reconnects. A wave of decisions is sent to a frozen redis-server of this file's own, the
 * server is killed with the wave inside it and started again on the same port: no bucket of the wave
 * may appear. A plain ioredis client (which resends unfulfilled commands by default) sends a write in
 * the same window, and its write does appear: the setup can see a replay when there is one.
 *
 * With ioredis 6.0.0 either of the module's client options prevents the replay on its own:
 * `maxRetriesPerRequest: 0` fails the in-flight commands at the first close (the queue a resend would
 * read is emptied), `autoResendUnfulfilledCommands: false` skips the resend. This test fails when both
 * are removed (checked by hand: the 20 wave buckets appear), not when only one is.
 */
const PREFIX = 'rl:';
const WAVE = 20;
const POLICY = { capacity: 10, refillPerSecond: 0.01 };

describe('commands in flight when the connection to Redis drops', () => {
  let server: RedisServer;
  let moduleRef: TestingModule;
  let buckets: BucketService;
  let moduleClient: Redis;
  let replaying: Redis;
  let check: Redis | undefined;

  beforeAll(async () => {
    server = await RedisServer.start();
    moduleRef = await Test.createTestingModule({
      imports: [RateLimitModule.forRoot({ redis: server.url, keyPrefix: PREFIX, failureMode: 'open', timeoutMs: 100 })],
    }).compile();
    moduleRef.useLogger(false);
    await moduleRef.init();
    buckets = moduleRef.get(BucketService);
    moduleClient = (moduleRef.get(BucketStore) as RedisBucketStore).client as Redis;
    // ioredis' defaults: an offline queue and unfulfilled commands resent after a reconnect.
    replaying = new Redis(server.url);
    replaying.on('error', () => undefined);
    await replaying.ping();
  });

  afterAll(async () => {
    try {
      replaying?.disconnect();
      check?.disconnect();
      await moduleRef?.close();
    } finally {
      // Even if closing failed.
      await server?.stop();
    }
  });

  it('are failed, and never run by the server that comes back on the same port', async () => {
    // Connected, the script loaded: the wave goes straight onto the socket.
    expect((await buckets.consume('warm-up', POLICY)).remaining).toBe(9);

    server.signal('SIGSTOP');
    const wave = await Promise.all(Array.from({ length: WAVE }, (_, i) => buckets.consume(`wave-${i}`, POLICY)));
    const control = replaying.set('control', 'replayed').catch(() => 'failed');
    // Every decision timed out and was allowed as if its bucket were full ('open')...
    expect(wave.map((d) => [d.allowed, d.remaining])).toEqual(wave.map(() => [true, 9]));
    // ...while its command stayed written and unanswered on the connection to the frozen server: with
    // coalescing (the default) the wave is 2 commands, the first decision alone and the other 19 together.
    expect((moduleClient as unknown as { commandQueue: { length: number } }).commandQueue.length).toBeGreaterThanOrEqual(2);
    await sleep(20);
    // Killed while still frozen: `stop()` alone would let it run (SIGCONT) for a moment before the kill.
    server.signal('SIGKILL');
    await server.stop();

    await server.start();
    check = await inspector(server.url);
    // Once the module's client has reconnected (it decides in Redis again), anything it resent has run.
    let after: string[] = [];
    for (const deadline = Date.now() + 6_000; Date.now() < deadline; await sleep(50)) {
      await buckets.consume('after-restart', POLICY);
      after = await keysUnder(check, PREFIX);
      if (after.includes(`${PREFIX}{after-restart}`)) break;
    }
    expect(after).toContain(`${PREFIX}{after-restart}`);
    // The plain client's write was replayed on its reconnect: a replay, when there is one, shows here.
    expect(await control).toBe('OK');
    expect(await check.get('control')).toBe('replayed');
    // The restarted server kept nothing (no persistence): the warm-up bucket is gone, and no wave bucket came back.
    expect(after).toEqual([`${PREFIX}{after-restart}`]);
  });
});
