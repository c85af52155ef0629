import { performance } from 'node:perf_hooks';
import type { INestApplication } from '@nestjs/common';
import { Test, type TestingModule } from '@nestjs/testing';
import type { Redis } from 'ioredis';
import { BucketService, BucketStore, type FailureMode, RateLimitModule, type RedisBucketStore, type Verdict } from 'nest-redis-rate-limit';
import { PLATFORMS } from '../../support/app.js';
import { type Answer, sleep } from '../../support/load.js';
import { watchLoopDelay } from '../../support/loop-delay.js';
import { commandCalls, RedisServer, testPrefix } from '../../support/redis.js';
import { CAPACITY } from './failure.controller.js';
import { appOnOwnRedis, startTogether } from './fixture.js';
import {
  MODES,
  THINK_MS,
  TIMEOUT_MS,
  WORKERS,
  expectOutageBurst,
  expectRedisLimitsBurst,
  figure,
  freshKeys,
  inspector,
  untilRedisDecides,
} from './scenario.js';
import {
  type Pair,
  SLACK_MS,
  expectPreconditions,
  expectWaitsBounded,
  expectWithinBounds,
  judgeDecisions,
  judgePairs,
  pairedBurst,
  startPairedLoad,
  timeDecisions,
  timingFigure,
  untilConclusive,
} from './timing.js';

/**
 * Redis that hangs instead of dying: the connection stays open and nothing answers (SIGSTOP), or the
 * server is busy in one long command (DEBUG SLEEP). Only the timeout can save a decision here.
 */
const FREEZE_MS = 700;

/** The Redis connection the app's module created (the one its decisions go through). */
const moduleClient = (app: INestApplication) => (app.get(BucketStore) as RedisBucketStore).client as Redis;

/**
 * Answers the failure mode gave to fresh keys: sent while Redis hung, answered before it could reply
 * again. More than WORKERS of them is a precondition of the scenario (checked by the caller).
 */
function expectModeAnswers(mode: FailureMode, answers: readonly Answer[]): void {
  // open allows; local allows a fresh key from a full in-process bucket; closed refuses.
  const expected = { open: 200, closed: 503, local: 200 }[mode];
  expect(answers.filter((a) => a.status !== expected)).toEqual([]);
  if (mode === 'closed') expect(new Set(answers.map((a) => a.retryAfter))).toEqual(new Set(['1']));
}

/** The six blocks' servers and apps, set up at once (their tests run one at a time). */
const together = startTogether();

describe.each(PLATFORMS)('Redis hanging on %s', (platform) => {
  describe.each(MODES)("failureMode '%s'", (mode) => {
    const prefix = testPrefix(`redis-paused-${platform}-${mode}`);
    const fx = appOnOwnRedis(
      platform,
      { keyPrefix: prefix, failureMode: mode, timeoutMs: TIMEOUT_MS },
      { redisArgs: ['--enable-debug-command', 'yes'], inspect: true, together },
    );

    it(`decides within timeoutMs (+ ${SLACK_MS} ms, in the app and over a control route) while Redis is frozen (SIGSTOP) for ${FREEZE_MS} ms, and sends it a bounded number of commands`, async () => {
      const attempt = async (n: number) => {
        const loop = watchLoopDelay();
        const decisions = timeDecisions(fx.app);
        try {
          const load = startPairedLoad(fx.url, WORKERS, { headers: freshKeys(`load-${n}`), thinkMs: THINK_MS });
          while (load.answers.length < 3 * WORKERS) await sleep(10);
          const commandsBefore = await commandCalls(fx.client, 'evalsha');
          fx.server.signal('SIGSTOP');
          const stopAt = performance.now();
          let outage: Pair[];
          try {
            await sleep(200);
            // Meanwhile a client's burst gets what the mode promises, the policy included.
            outage = await pairedBurst(fx.url, `frozen-${n}`, CAPACITY + 3);
            await sleep(FREEZE_MS - (performance.now() - stopAt));
            load.stop();
            await load.done;
          } finally {
            fx.server.signal('SIGCONT');
          }
          // Redis runs a connection's commands in order: once a PING on the module's own connection is
          // answered, every command the frozen server had received on it has run and is counted.
          await moduleClient(fx.app).ping();
          const commandsSent = (await commandCalls(fx.client, 'evalsha')) - commandsBefore;
          loop.stop();
          decisions.restore();

          const answers = load.answers;
          const frozen = answers.filter((a) => a.startedAt >= stopAt);
          expect(answers.filter((a) => a.status === 0)).toEqual([]);
          // One decision per limited request, none for the control route.
          expect(decisions.spans).toHaveLength(load.pairs.length + outage.length);
          expectModeAnswers(mode, frozen);
          expectOutageBurst(
            mode,
            outage.map((p) => p.limited),
          );
          // In flight at the freeze, sent before the first timeout, and one probe per timeoutMs after it;
          // without the probe rule every answered request would have left a command waiting in the socket.
          const bound = 2 * WORKERS + Math.ceil(FREEZE_MS / TIMEOUT_MS) + 2;
          expect(commandsSent).toBeLessThanOrEqual(bound);
          figure(`${platform}/${mode} SIGSTOP: answers while frozen, commands sent to Redis`, `${frozen.length}, ${commandsSent}`);

          const judgements = [
            judgeDecisions(decisions.spans, stopAt, TIMEOUT_MS, loop),
            judgePairs([...load.pairs, ...outage], stopAt, TIMEOUT_MS, loop),
          ];
          timingFigure(`${platform}/${mode} SIGSTOP run ${n + 1}`, judgements, loop);
          expectWithinBounds(judgements);
          // Judged above, whatever follows. On a loaded machine fewer requests reach the app while Redis
          // is frozen: the bound on commands means something only for more answers than commands.
          expectPreconditions({
            'answers while frozen': { needed: `over ${bound}`, seen: frozen.length, met: frozen.length > bound },
          });
          return judgements;
        } finally {
          loop.stop();
          decisions.restore();
        }
      };
      await untilConclusive(`${platform}/${mode} SIGSTOP`, attempt, () => untilRedisDecides(fx.url, fx.client, prefix));
    });

    it('limits a burst through Redis again as soon as it thaws', async () => {
      const tookMs = await untilRedisDecides(fx.url, fx.client, prefix);
      figure(`${platform}/${mode} SIGCONT: Redis decides again after (ms)`, tookMs);
      await expectRedisLimitsBurst(fx.url, fx.client, prefix, 'after-thaw');
    });

    it(`decides within timeoutMs (+ ${SLACK_MS} ms, in the app and over a control route) while Redis runs DEBUG SLEEP 0.5, then limits through Redis again`, async () => {
      const attempt = async (n: number) => {
        const loop = watchLoopDelay();
        const decisions = timeDecisions(fx.app);
        try {
          const load = startPairedLoad(fx.url, WORKERS, { headers: freshKeys(`load-2-${n}`), thinkMs: THINK_MS });
          while (load.answers.length < 3 * WORKERS) await sleep(10);
          const sleeper = await inspector(fx.server.url);
          const sentAt = performance.now();
          await sleeper.call('DEBUG', 'SLEEP', '0.5');
          const wokeAt = performance.now();
          sleeper.disconnect();
          await sleep(100);
          load.stop();
          const answers = await load.done;
          loop.stop();
          decisions.restore();

          expect(answers.filter((a) => a.status === 0)).toEqual([]);
          const asleep = answers.filter((a) => a.startedAt >= sentAt + 20 && a.endedAt <= wokeAt - 20);
          expectModeAnswers(mode, asleep);
          const judgements = [judgeDecisions(decisions.spans, sentAt, TIMEOUT_MS, loop), judgePairs(load.pairs, sentAt, TIMEOUT_MS, loop)];
          timingFigure(`${platform}/${mode} DEBUG SLEEP run ${n + 1}`, judgements, loop);
          expectWithinBounds(judgements);
          expectPreconditions({
            'answers while Redis slept': { needed: `over ${WORKERS}`, seen: asleep.length, met: asleep.length > WORKERS },
          });
          return judgements;
        } finally {
          loop.stop();
          decisions.restore();
        }
      };
      const between = () => untilRedisDecides(fx.url, fx.client, prefix);
      await untilConclusive(`${platform}/${mode} DEBUG SLEEP`, attempt, between);
      await between();
      await expectRedisLimitsBurst(fx.url, fx.client, prefix, 'after-sleep');
    });
  });
});

describe('BucketService with a frozen Redis', () => {
  const prefix = testPrefix('redis-paused-service');
  const timeoutMs = 150;
  let server: RedisServer;
  let moduleRef: TestingModule;
  let buckets: BucketService;
  // Large enough that the decisions the frozen Redis runs on thaw leave it far from empty.
  const request = { key: `${prefix}{probe-rule}`, capacity: 1000, refillPerSecond: 1, cost: 1 };
  /** Decides `n` at once; returns each verdict with when it was asked for and when it came. */
  const wave = (n: number) =>
    Promise.all(
      Array.from({ length: n }, async () => {
        const startedAt = performance.now();
        const verdict: Verdict = await buckets.decide([request]);
        const endedAt = performance.now();
        return { source: verdict.source, ms: endedAt - startedAt, startedAt, endedAt };
      }),
    );

  beforeAll(async () => {
    server = await RedisServer.start();
    moduleRef = await Test.createTestingModule({
      imports: [RateLimitModule.forRoot({ redis: server.url, keyPrefix: prefix, failureMode: 'closed', timeoutMs })],
    }).compile();
    moduleRef.useLogger(false);
    await moduleRef.init();
    buckets = moduleRef.get(BucketService);
  });

  afterAll(async () => {
    try {
      await moduleRef?.close();
    } finally {
      // Even if closing failed.
      await server?.stop();
    }
  });

  it('once decisions fail in a row, makes only one at a time wait for a Redis that stopped answering; the others follow failureMode at once', async () => {
    expect((await buckets.decide([request])).source).toBe('store');
    const loop = watchLoopDelay();
    server.signal('SIGSTOP');
    try {
      // Nothing has failed yet: all 20 ask Redis, and all give up after timeoutMs, not before and not
      // more than SLACK_MS (40 ms) plus the loop delay meanwhile after it.
      const first = await wave(20);
      expect(first.map((d) => d.source)).toEqual(first.map(() => 'closed'));
      expect(Math.min(...first.map((d) => d.ms))).toBeGreaterThanOrEqual(timeoutMs - 1);
      expectWaitsBounded(first, timeoutMs, loop);
      // Now it is known to fail: one probe waits, as long as the first ones; 39 are answered without asking.
      const second = await wave(40);
      expect(second.map((d) => d.source)).toEqual(second.map(() => 'closed'));
      const waited = second.filter((d) => d.ms >= timeoutMs - 1);
      const immediate = second.filter((d) => d.ms < timeoutMs / 2);
      expect([waited.length, immediate.length]).toEqual([1, 39]);
      expectWaitsBounded(second, timeoutMs, loop);
    } finally {
      server.signal('SIGCONT');
      loop.stop();
    }
  });

  it('goes back to Redis on the first decision after the thaw, with no timer and no restart', async () => {
    const verdict = await buckets.decide([request]);
    expect(verdict.source).toBe('store');
    // The decision before the freeze took a token; the ones that waited in the socket ran on thaw.
    expect(verdict.decisions[0].remaining).toBeLessThan(998);
  });

  it('keeps asking Redis for every decision after one slow reply: a single timeout is no outage', async () => {
    const loop = watchLoopDelay();
    server.signal('SIGSTOP');
    try {
      const [slow] = await wave(1);
      expect(slow.source).toBe('closed');
      expect(slow.ms).toBeGreaterThanOrEqual(timeoutMs - 1);
      expectWaitsBounded([slow], timeoutMs, loop);
    } finally {
      server.signal('SIGCONT');
      loop.stop();
    }
    const after = await wave(20);
    expect(after.map((d) => d.source)).toEqual(after.map(() => 'store'));
  });
});
