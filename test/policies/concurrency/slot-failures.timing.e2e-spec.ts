import { Controller, Get, type INestApplication, Module, Param } from '@nestjs/common';
import { Test, type TestingModule } from '@nestjs/testing';
import { Redis } from 'ioredis';
import request from 'supertest';
import { BucketService, ConcurrencyLimit, type FailureMode, RateLimit, RateLimitModule } from 'nest-redis-rate-limit';
import { createApp } from '../../support/app.js';
import { RedisServer } from '../../support/redis.js';

/**
 * Concurrency slots in time (issue 36, item 1), on a Redis of this file's own (it is paused and killed):
 * a long request keeps its slot by renewing it, and nothing runs once nothing is in flight; a holder
 * that died frees its slot when its lease ends; a take that timed out but was granted is given back; and
 * while Redis fails, failureMode answers within timeoutMs.
 */
const TIMEOUT_MS = 150;

/** Requests held in their handler until the test lets them go. */
const held = new Map<string, () => void>();

/** A rate policy and a slot decided in the same phase: one store call takes both (take-with-slot.lua). */
@Controller('together')
class TogetherController {
  @Get(':id')
  @RateLimit({ capacity: 5, refillPerSecond: 0.001, name: 'together-rate', phase: 'after-guards' })
  @ConcurrencyLimit({ limit: 1, name: 'together' })
  async together(@Param('id') id: string) {
    await new Promise<void>((resolve) => held.set(id, resolve));
    return { id };
  }
}

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

  describe('a route whose rate policy and slot are one call (take-with-slot.lua)', () => {
    let app: INestApplication | undefined;
    afterEach(async () => {
      for (const release of held.values()) release();
      held.clear();
      await app?.close();
      app = undefined;
    });

    async function start(failureMode: FailureMode): Promise<string> {
      prefix = `slot-failures:${n++}:`;
      @Module({
        imports: [RateLimitModule.forRoot({ redis: server.url, keyPrefix: prefix, timeoutMs: TIMEOUT_MS, failureMode })],
        controllers: [TogetherController],
      })
      class TogetherModule {}
      app = await createApp(TogetherModule, 'express');
      app.useLogger(false);
      await app.listen(0, '127.0.0.1');
      return app.getUrl();
    }

    /** Resolves once the handler of `id` runs. */
    async function entered(id: string): Promise<void> {
      for (let i = 0; i < 200 && !held.has(id); i++) await sleep(5);
      if (!held.has(id)) throw new Error(`the handler of ${id} never ran`);
    }

    it.each([
      ['closed', 503],
      ['local', 429],
    ] as const)(
      "answers within timeoutMs + 200 ms while Redis is paused: failureMode '%s', the second request %d",
      async (mode, second) => {
        const url = await start(mode);
        server.signal('SIGSTOP');
        try {
          let started = performance.now();
          const first = request(url).get('/together/first');
          const firstStatus = first.then((r) => r.status);
          if (mode === 'local') {
            // The in-process buckets and slots decide: the first runs, in the one local slot.
            await entered('first');
            expect(performance.now() - started).toBeLessThan(TIMEOUT_MS + 200);
          } else {
            expect(await firstStatus).toBe(503);
            expect(performance.now() - started).toBeLessThan(TIMEOUT_MS + 200);
          }
          started = performance.now();
          const other = await request(url).get('/together/second');
          expect(performance.now() - started).toBeLessThan(TIMEOUT_MS + 200);
          expect(other.status).toBe(second);
          if (mode === 'local') {
            expect(other.headers['concurrency-limit']).toBe('1');
            held.get('first')!();
            expect(await firstStatus).toBe(200);
            // The refused request's local token went back: 5 - first - this one.
            // supertest sends on then(): now.
            const third = request(url)
              .get('/together/third')
              .then((r) => r);
            await entered('third');
            held.get('third')!();
            expect((await third).headers['x-ratelimit-remaining']).toBe('3');
          }
        } finally {
          server.signal('SIGCONT');
        }
      },
    );

    it("gives back a slot granted after the call timed out (failureMode 'open')", async () => {
      const url = await start('open');
      server.signal('SIGSTOP');
      let response;
      try {
        const started = performance.now();
        response = request(url)
          .get('/together/late')
          .then((r) => r);
        await entered('late');
        // The request runs without a slot, admitted within the deadline.
        expect(performance.now() - started).toBeLessThan(TIMEOUT_MS + 200);
      } finally {
        server.signal('SIGCONT');
      }
      // Redis ran the script when it woke up and granted the slot to nobody: its late reply gives it back.
      let left = 1;
      for (let i = 0; i < 100 && left > 0; i++) {
        await sleep(20);
        left = await client.exists(`${prefix}{ip:127.0.0.1}!together`);
      }
      expect(left).toBe(0);
      held.get('late')!();
      expect((await response).status).toBe(200);
    });
  });
});
