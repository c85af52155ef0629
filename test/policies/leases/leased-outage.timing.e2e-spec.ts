import { performance } from 'node:perf_hooks';
import type { INestApplication } from '@nestjs/common';
import { Redis } from 'ioredis';
import { createApp } from '../../support/app.js';
import { RedisServer, testPrefix } from '../../support/redis.js';
import { type Answer, leasedIn, Loader } from './leased-load.js';
import { leasedSemanticsAppModule } from './leased-semantics.controllers.js';

const TIMEOUT_MS = 300;
/** The hot route's lease life (leased-semantics.controllers.ts). */
const LIFE_MS = 600;

/**
 * A Redis that stops answering (SIGSTOP) while this instance holds a live lease (issue 35, item 4):
 * every decision is still answered within timeoutMs; the lease's tokens are spent here until it ends
 * (no renewal can succeed), never more than it held; then failureMode ('closed': 503).
 */
describe('a leased bucket while Redis stops answering', () => {
  let server: RedisServer;
  let client: Redis;
  let app: INestApplication;
  const loader = new Loader();

  beforeAll(async () => {
    server = await RedisServer.start();
    client = new Redis(server.url);
  });

  afterAll(async () => {
    server?.signal('SIGCONT');
    await app?.close().catch(() => undefined);
    loader.destroy();
    client?.disconnect();
    await server?.stop();
  });

  it('spends the live lease until it ends, within timeoutMs each, then answers 503', async () => {
    const keyPrefix = testPrefix('leased-outage');
    app = await createApp(
      leasedSemanticsAppModule({ redis: server.url, keyPrefix, failureMode: 'closed', timeoutMs: TIMEOUT_MS }),
      'express',
      (a) => a.useLogger(false),
    );
    await app.listen(0, '127.0.0.1');
    const url = `${await app.getUrl()}/sem/hot`;
    // Hot: a batch of 20 leased for 600 ms, renewed while it is spent.
    await loader.load(url, 1_500, 16);
    await new Promise((r) => setTimeout(r, 30)); // the last renewal answered
    const held = leasedIn(await client.hgetall(`${keyPrefix}{id:everyone}:hot`));
    expect(held).toBeGreaterThan(0);
    server.signal('SIGSTOP');
    const stoppedAt = performance.now();
    // 15 requests a second for 1.5 s, each sent on time whatever the others wait: the lease's tokens
    // would last longer than its life.
    const pending: Promise<Answer>[] = [];
    while (performance.now() - stoppedAt < 1_500) {
      pending.push(loader.get(url));
      await new Promise((r) => setTimeout(r, 66));
    }
    const answers = await Promise.all(pending);
    server.signal('SIGCONT');

    for (const answer of answers) expect(answer.answeredAt - answer.sentAt).toBeLessThan(TIMEOUT_MS + 200);
    expect(answers.every((a) => a.status === 200 || a.status === 503)).toBe(true);
    const admitted = answers.filter((a) => a.status === 200);
    // The lease's tokens were spent here, never more than it held, and never after it ended.
    expect(admitted.length).toBeGreaterThanOrEqual(3);
    expect(admitted.length).toBeLessThanOrEqual(held);
    for (const answer of admitted) expect(answer.sentAt - stoppedAt).toBeLessThan(LIFE_MS);
    // Then failureMode: every request sent after the lease's end answered 503.
    const after = answers.filter((a) => a.sentAt - stoppedAt >= LIFE_MS);
    expect(after.length).toBeGreaterThanOrEqual(5);
    expect(after.every((a) => a.status === 503)).toBe(true);
  });
});
