import { performance } from 'node:perf_hooks';
import { redisAnswers } from 'nest-redis-rate-limit';
import { gatewayRateLimitOptions } from '../../../apps/gateway/src/redis-probe.js';
import { watchLoopDelay } from '../../support/loop-delay.js';
import { freePort, RedisServer, redisUrl } from '../../support/redis.js';

/** Beyond the probe's timeout and the loop delay measured over it: a generous bound on a failure path. */
const SLACK_MS = 500;

/**
 * `redisAnswers(url, timeoutMs)` answers within about `timeoutMs`, whatever is at `url`. A Redis that is
 * frozen (SIGSTOP; or a server that accepts and never replies) accepts the connection in the kernel and
 * never answers: the probe waited for its PING forever, and the demo gateway's `npm start` with it.
 */
describe('redisAnswers', () => {
  let frozen: RedisServer;

  beforeAll(async () => {
    frozen = await RedisServer.start();
    frozen.signal('SIGSTOP');
  });
  afterAll(async () => {
    await frozen?.stop();
  });

  /** What `probe` answered, and how long it took less the loop delay measured over it. */
  async function timed<T>(probe: () => Promise<T>): Promise<{ answer: T; ms: number }> {
    const loop = watchLoopDelay();
    const started = performance.now();
    const answer = await probe();
    const ended = performance.now();
    loop.stop();
    return { answer, ms: ended - started - loop.over(started, ended) };
  }

  it('answers true for a Redis that answers, false where nothing listens', async () => {
    expect(await redisAnswers(await redisUrl(), 1000)).toBe(true);
    expect(await redisAnswers(`redis://127.0.0.1:${await freePort()}`, 1000)).toBe(false);
  });

  it.each([250, 1000])('answers false for a frozen Redis within timeoutMs (%d ms)', async (timeoutMs) => {
    const { answer, ms } = await timed(() => redisAnswers(frozen.url, timeoutMs));
    expect(answer).toBe(false);
    expect(ms).toBeLessThan(timeoutMs + SLACK_MS);
  });

  it('the demo gateway starts on the in-process store when its Redis is frozen, within its probe of 1 s', async () => {
    const { answer, ms } = await timed(() => gatewayRateLimitOptions(frozen.url));
    expect(answer).toEqual({ store: 'memory', keyPrefix: 'gateway:' });
    expect(ms).toBeLessThan(1000 + SLACK_MS);
  });
});
