import { Test, type TestingModule } from '@nestjs/testing';
import { Redis } from 'ioredis';
import { BucketService, type FailureMode, RateLimitModule } from 'nest-redis-rate-limit';
import { RedisServer } from '../../support/redis.js';

/**
 * Concurrency slots in time (issue 36, item 1), on a Redis of this file's own (it is paused and killed):
 * a long request keeps its slot by renewing it, and nothing runs once nothing is in flight; a holder
 * that died frees its slot when its lease ends; a take that timed out but was granted is given back; and
 * while Redis fails, failureMode answers within timeoutMs.
 */
const TIMEOUT_MS = 150;

describe('concurrency slots over time and failures', () => {
  let server: RedisServer;
  let client: Redis;
  let moduleRef: TestingModule | undefined;
  let buckets: BucketService;
  let prefix = '';
  let n = 0;

  beforeAll(async () => {
    server = await RedisServer.start();
    client = new Redis(server.url);
  });
  afterAll(async () => {
    client?.disconnect();
    await server?.stop();
  });
  afterEach(async () => {
    await moduleRef?.close();
    moduleRef = undefined;
  });

  async function open(failureMode: FailureMode = 'closed'): Promise<void> {
    prefix = `slot-failures:${n++}:`;
    moduleRef = await Test.createTestingModule({
      imports: [RateLimitModule.forRoot({ redis: server.url, keyPrefix: prefix, timeoutMs: TIMEOUT_MS, failureMode })],
    }).compile();
    moduleRef.useLogger(false);
    await moduleRef.init();
    buckets = moduleRef.get(BucketService);
  }

  const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

  async function scriptCalls(): Promise<number> {
    const stats = await client.info('commandstats');
    return [...stats.matchAll(/cmdstat_(?:evalsha|eval):calls=(\d+)/g)].reduce((sum, m) => sum + Number(m[1]), 0);
  }

  it('renews a slot held past its lease, and sends nothing once no slot is held', async () => {
    await open();
    const slot = await buckets.takeSlot('long', { limit: 1, leaseMs: 300 });
    // Four leases long: without renewals, another take would get the slot after 300 ms.
    for (const at of [400, 400, 400]) {
      await sleep(at);
      expect((await buckets.takeSlot('long', { limit: 1, leaseMs: 300 })).held).toBe(false);
    }
    await slot.release();
    expect(await client.exists(`${prefix}{long}!`)).toBe(0);
    const before = await scriptCalls();
    await sleep(700);
    // The INFO calls aside, no script ran: no timer renews a slot that is gone.
    expect((await scriptCalls()) - before).toBe(0);
  });

  it('frees the slot of a holder that died when its lease ends, not before', async () => {
    await open();
    const key = `${prefix}{orphan}!`;
    // Another instance took the slot and died: nobody renews it or gives it back.
    const store = (await import('nest-redis-rate-limit')).RedisBucketStore;
    const other = new store(new Redis(server.url, { enableOfflineQueue: false, lazyConnect: true }), false);
    await other.client.connect();
    expect((await other.takeSlot({ key, limit: 1, holder: 'dead-instance.0', leaseMs: 500 })).held).toBe(true);
    other.client.disconnect();
    const started = performance.now();
    expect((await buckets.takeSlot('orphan', { limit: 1 })).held).toBe(false);
    let free = false;
    while (!free && performance.now() - started < 2_000) {
      await sleep(25);
      const slot = await buckets.takeSlot('orphan', { limit: 1 });
      free = slot.held;
      await slot.release();
    }
    const freedAfter = performance.now() - started;
    expect(free).toBe(true);
    expect(freedAfter).toBeGreaterThanOrEqual(450);
    expect(freedAfter).toBeLessThan(500 + 400);
    expect(await client.exists(key)).toBe(0);
  });

  it('gives back a take that timed out once Redis answers it after all', async () => {
    await open('open');
    server.signal('SIGSTOP');
    let slot;
    try {
      const started = performance.now();
      slot = await buckets.takeSlot('late', { limit: 1 });
      // failureMode 'open': the work runs without a slot, answered within the deadline.
      expect([slot.held, slot.source]).toEqual([true, 'open']);
      expect(performance.now() - started).toBeLessThan(TIMEOUT_MS + 200);
    } finally {
      server.signal('SIGCONT');
    }
    await slot.release();
    // The script ran when Redis woke up and granted the slot; its late reply gave it back.
    let left = 1;
    for (let i = 0; i < 100 && left > 0; i++) {
      await sleep(20);
      left = await client.exists(`${prefix}{late}!`);
    }
    expect(left).toBe(0);
  });

  it.each([
    ['closed', [false, 'closed']],
    ['open', [true, 'open']],
    ['local', [true, 'local']],
  ] as const)('answers within timeoutMs + 200 ms while Redis is paused: failureMode %s', async (mode, expected) => {
    await open(mode);
    server.signal('SIGSTOP');
    try {
      const started = performance.now();
      const first = await buckets.takeSlot('paused', { limit: 1 });
      expect(performance.now() - started).toBeLessThan(TIMEOUT_MS + 200);
      expect([first.held, first.source]).toEqual(expected);
      if (mode === 'local') {
        // The in-process slots keep the limit meanwhile.
        const second = await buckets.takeSlot('paused', { limit: 1 });
        expect([second.held, second.source]).toEqual([false, 'local']);
        await first.release();
        expect((await buckets.takeSlot('paused', { limit: 1 })).held).toBe(true);
      }
      if (mode === 'closed') {
        await expect(buckets.withSlot('paused', { limit: 1 }, () => 'ran')).rejects.toMatchObject({ code: 'ERR_RATE_LIMIT_UNAVAILABLE' });
      }
    } finally {
      server.signal('SIGCONT');
    }
  });
});
