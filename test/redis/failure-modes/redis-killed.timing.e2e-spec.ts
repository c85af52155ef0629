import { performance } from 'node:perf_hooks';
import type { INestApplication } from '@nestjs/common';
import { BucketStore, type RedisBucketStore } from 'nest-redis-rate-limit';
import { PLATFORMS } from '../../support/app.js';
import { countByStatus, inFlightAt, sleep, timedGet } from '../../support/load.js';
import { watchLoopDelay } from '../../support/loop-delay.js';
import { testPrefix } from '../../support/redis.js';
import { CAPACITY } from './failure.controller.js';
import { appOnOwnRedis, startTogether } from './fixture.js';
import {
  MODES,
  THINK_MS,
  TIMEOUT_MS,
  WORKERS,
  burst,
  expectOutageBurst,
  expectRedisLimitsBurst,
  figure,
  freshKeys,
  inspector,
  untilRedisDecides,
} from './scenario.js';
import {
  SLACK_MS,
  expectPreconditions,
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
 * Redis is SIGKILLed under load, then started again on the same port. Each scenario has a
 * redis-server of its own; the shared server is never touched. An unhandled rejection anywhere in the
 * app fails the running test (jest reports it), and the app serving after the kill shows it did not
 * crash.
 */
const WAVE = 24;

/** The ioredis connection the app's module created, with its queue of commands sent and not yet answered. */
const moduleClient = (app: INestApplication) =>
  (app.get(BucketStore) as RedisBucketStore).client as unknown as {
    commandQueue: { toArray(): { command: { name: string; args: unknown[] } }[] };
  };

/**
 * Decisions sent on that connection and not yet answered: the keys of its script calls (EVALSHA sha
 * numkeys ...; every route here has one policy, so one key per decision), however coalescing grouped
 * them into calls. Counting commands instead undercounts a wave that arrived in few event-loop turns.
 */
const decisionsInsideRedis = (app: INestApplication) => {
  let decisions = 0;
  for (const { command } of moduleClient(app).commandQueue.toArray()) {
    if (command.name === 'evalsha' || command.name === 'eval') decisions += Number(command.args[1]);
  }
  return decisions;
};

/** The six blocks' servers and apps, set up at once (their tests run one at a time). */
const together = startTogether();

describe.each(PLATFORMS)('Redis killed under load on %s', (platform) => {
  describe.each(MODES)("failureMode '%s'", (mode) => {
    const prefix = testPrefix(`redis-killed-${platform}-${mode}`);
    const fx = appOnOwnRedis(platform, { keyPrefix: prefix, failureMode: mode, timeoutMs: TIMEOUT_MS }, { together });

    it(`decides within timeoutMs (+ ${SLACK_MS} ms, in the app and over a control route) when Redis dies with ${WAVE} decisions inside it, as '${mode}' says`, async () => {
      const attempt = async (n: number) => {
        // A key Redis has denied: the deny cache keeps denying it in process, Redis or not.
        const drained = await burst(`${fx.url}/once`, `drained-${n}`, 2);
        expect(drained.map((a) => a.status)).toEqual([200, 429]);

        const loop = watchLoopDelay();
        const decisions = timeDecisions(fx.app);
        try {
          const load = startPairedLoad(fx.url, WORKERS, { headers: freshKeys(`load-${n}`), thinkMs: THINK_MS });
          while (load.answers.length < 3 * WORKERS) await sleep(10);
          // Freeze Redis a moment (less than timeoutMs) so that a wave of decisions is surely inside it,
          // unanswered, when it dies.
          const freezeAt = performance.now();
          fx.server.signal('SIGSTOP');
          // Not paired with control requests: they would slow the wave on its way into Redis (its decisions
          // are timed in the app all the same).
          const wave = Array.from({ length: WAVE }, (_, i) => timedGet(fx.url, { 'x-api-key': `wave-${n}-${i}` }));
          // Until the wave is written to the frozen server's connection, unanswered (inside Redis, not merely
          // sent by the test), and at most 80 ms: before the first decision gives up on it (timeoutMs).
          const until = freezeAt + 80;
          while (decisionsInsideRedis(fx.app) < WAVE && performance.now() < until) await sleep(5);
          const insideRedis = decisionsInsideRedis(fx.app);
          const killAt = performance.now();
          // Killed while still frozen: `stop()` alone sends SIGCONT first, which would let it answer part of the wave.
          fx.server.signal('SIGKILL');
          await fx.server.stop();
          const deadAt = performance.now();
          await sleep(600);
          load.stop();
          await load.done;
          const waveAnswers = await Promise.all(wave);
          // Still down: a fresh key gets exactly what the mode promises, and the app still serves.
          const outage = await pairedBurst(fx.url, `outage-${n}`, CAPACITY + 3);
          loop.stop();
          decisions.restore();
          const pairs = [...load.pairs, ...outage];
          const answers = [...load.answers, ...waveAnswers].sort((a, b) => a.startedAt - b.startedAt);

          expect(answers.filter((a) => a.status === 0)).toEqual([]);
          // One decision per limited request, none for the control route.
          expect(decisions.spans).toHaveLength(pairs.length + WAVE);
          figure(
            `${platform}/${mode} kill: answers, in flight at the kill, decisions inside Redis`,
            `${answers.length}, ${inFlightAt(answers, killAt)}, ${insideRedis}`,
          );

          // While Redis lived it allowed every fresh key; once it was dead the mode answered.
          expect(countByStatus(answers.filter((a) => a.endedAt < freezeAt))).toEqual({
            200: answers.filter((a) => a.endedAt < freezeAt).length,
          });
          const after = answers.filter((a) => a.startedAt >= deadAt);
          const expected = { open: 200, closed: 503, local: 200 }[mode];
          expect(after.filter((a) => a.status !== expected)).toEqual([]);
          if (mode === 'closed') expect(new Set(after.map((a) => a.retryAfter))).toEqual(new Set(['1']));
          expectOutageBurst(
            mode,
            outage.map((p) => p.limited),
          );
          // The key Redis denied a moment ago is still denied, in every mode: that is Redis's own answer.
          const denied = await timedGet(`${fx.url}/once`, { 'x-api-key': `drained-${n}` });
          expect([denied.status, denied.remaining]).toEqual([429, '0']);

          const judgements = [judgeDecisions(decisions.spans, freezeAt, TIMEOUT_MS, loop), judgePairs(pairs, freezeAt, TIMEOUT_MS, loop)];
          timingFigure(`${platform}/${mode} kill run ${n + 1}`, judgements, loop);
          expectWithinBounds(judgements);
          // Judged above, whatever follows: what the scenario needs to have happened for the run to show
          // anything. On a busy machine part of the wave reaches the app after the breaker has opened (3
          // timeouts of the load, ~timeoutMs after the freeze) and never goes to Redis, and fewer requests
          // of the load reach the app after the kill: such a run proves nothing either way, and runs again.
          const inFlight = inFlightAt(answers, killAt);
          expectPreconditions({
            'requests in flight at the kill': { needed: `${WAVE} at least`, seen: inFlight, met: inFlight >= WAVE },
            // A third of the wave inside Redis is still a wave cut off by the kill.
            'decisions inside Redis at the kill': { needed: `${WAVE / 3} at least`, seen: insideRedis, met: insideRedis >= WAVE / 3 },
            'requests sent after the kill': { needed: `over ${2 * WORKERS}`, seen: after.length, met: after.length > 2 * WORKERS },
          });
          return judgements;
        } finally {
          loop.stop();
          decisions.restore();
        }
      };
      // Before another run: Redis back on its port, and deciding again.
      const between = async () => {
        await fx.server.start();
        const client = await inspector(fx.server.url);
        try {
          await untilRedisDecides(fx.url, client, prefix);
        } finally {
          client.disconnect();
        }
      };
      await untilConclusive(`${platform}/${mode} kill`, attempt, between);
    });

    it('limits a burst through Redis again once it is back on the same port, without restarting the app', async () => {
      await fx.server.start();
      fx.client = await inspector(fx.server.url);
      const tookMs = await untilRedisDecides(fx.url, fx.client, prefix);
      figure(`${platform}/${mode} restart: Redis decides again after (ms)`, tookMs);
      await expectRedisLimitsBurst(fx.url, fx.client, prefix, 'after-restart');
    });
  });
});
