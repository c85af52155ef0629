import { Logger } from '@nestjs/common';
import type { Redis } from 'ioredis';
import { sleep } from '../../support/load.js';
import { LogRecorder } from '../../support/log-recorder.js';
import { freePort, redisUrl, testPrefix } from '../../support/redis.js';
import { LocalSentinels } from '../../support/sentinel.js';
// Not public: the module's own client, as `RateLimitModule.forRoot({ redis })` creates it.
import { createRedisClient } from '../../../libs/rate-limit/src/stores/redis/redis-client.js';

/**
 * What the module's own client says, in the library's words rather than ioredis': a call lost with its
 * connection, and a pass over the sentinels that named no master (docs/guides/redis-sentinel.md,
 * "What is logged"). Real servers and sentinels; the lines as the app's logger receives them.
 */

const recorder = new LogRecorder();
beforeAll(() => Logger.overrideLogger(recorder));
afterAll(() => Logger.overrideLogger(false));

async function waitFor<T>(what: string, check: () => T | undefined, timeoutMs = 10_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = check();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`not within ${timeoutMs} ms: ${what}`);
    await sleep(10);
  }
}

const warnings = (about: string) => recorder.of('RateLimit', 'warn').filter((line) => line.includes(about));

it('a call in flight when the connection closes fails with ERR_RATE_LIMIT_REDIS_NOT_CONNECTED, saying what happened and what comes next', async () => {
  const url = await redisUrl();
  const client = createRedisClient(url).client as Redis;
  try {
    await client.connect();
    // A call that waits for an answer Redis holds back (BLPOP on an empty list), then its connection drops.
    const call = client.call('BLPOP', `${testPrefix('sentinel-logs')}empty`, '5');
    const failed = call.then(
      () => undefined,
      (error: unknown) => error,
    );
    await sleep(50);
    client.disconnect(true);
    const error = (await failed) as Error & { code?: string };
    const { hostname, port } = new URL(url);
    expect(error.code).toBe('ERR_RATE_LIMIT_REDIS_NOT_CONNECTED');
    expect(error.message).toBe(
      `the connection to Redis at ${hostname}:${port} closed before the answer came; the call is not sent again ` +
        '(it may have been decided on the server), and the client reconnects',
    );
    // ioredis' own words are gone.
    expect(error.message).not.toMatch(/max retries/i);
  } finally {
    client.disconnect();
  }
});

describe('the sentinels asked for the master', () => {
  let d: LocalSentinels;
  beforeAll(async () => {
    d = await LocalSentinels.start({ failover: false });
  }, 60_000);
  afterAll(() => d?.stop());

  it('none named it: one line says what each sentinel asked did (refused, an unknown name) and when ioredis asks again', async () => {
    const dead = await freePort();
    const live = d.sentinels[0].port;
    const name = 'no-such-master';
    const target = `Redis master "${name}" via sentinels 127.0.0.1:${dead}, 127.0.0.1:${live}`;
    const client = createRedisClient({
      sentinels: [
        { host: '127.0.0.1', port: dead },
        { host: '127.0.0.1', port: live },
      ],
      name,
    }).client as Redis;
    try {
      client.connect().catch(() => undefined);
      const line = await waitFor('a warning', () => warnings(target)[0]);
      expect(line).toBe(
        `Cannot connect to ${target}: no sentinel gave the master's address (sentinel 127.0.0.1:${dead}: no connection ` +
          `(refused, or closed before it answered); sentinel 127.0.0.1:${live} knows no master named "${name}"); ` +
          'decisions follow failureMode until one does and the master answers; ioredis asks them again in 10 ms',
      );
    } finally {
      client.disconnect();
    }
  });

  it('each reconnect asks the next sentinel; reaching the end of the list is no failure and logs nothing', async () => {
    const client = createRedisClient(d.options).client as Redis;
    const raw: string[] = [];
    client.on('error', (error: Error) => raw.push(error.message));
    const target = `via sentinels 127.0.0.1:${d.sentinels[0].port},`;
    try {
      await client.connect();
      // ioredis goes on from where its last lookup left its list: the fourth reconnect finds its end.
      for (let i = 0; i < 4; i++) {
        const ready = new Promise((resolve) => client.once('ready', resolve));
        client.disconnect(true);
        await ready;
      }
      // ioredis said "All sentinels are unreachable" although every sentinel answered...
      expect(raw.filter((m) => m.startsWith('All sentinels are unreachable. Retrying from scratch'))).not.toEqual([]);
      // ...and the module says nothing of it.
      expect(warnings(target)).toEqual([]);
    } finally {
      client.disconnect();
    }
  });
});
