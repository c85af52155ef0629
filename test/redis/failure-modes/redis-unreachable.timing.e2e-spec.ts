import { performance } from 'node:perf_hooks';
import type { LoggerService } from '@nestjs/common';
import { PLATFORMS } from '../../support/app.js';
import { watchLoopDelay } from '../../support/loop-delay.js';
import { testPrefix } from '../../support/redis.js';
import { CAPACITY } from './failure.controller.js';
import { appOnOwnRedis } from './fixture.js';
import { MODES, TIMEOUT_MS, expectOutageBurst, expectRedisLimitsBurst, figure, inspector, untilRedisDecides } from './scenario.js';
import { SLACK_MS, judgeDecisions, judgePairs, pairedBurst, timeDecisions, timingFigure, untilConclusive } from './timing.js';

/** How long start-up waits for a connection it created before going on (CONNECT_WAIT_MS). */
const CONNECT_WAIT_MS = 1_000;

/** Keeps the warnings and errors the limiter logs. */
class WarningRecorder implements LoggerService {
  readonly warnings: string[] = [];
  readonly errors: string[] = [];
  log() {}
  error(message: unknown, ...rest: unknown[]) {
    if (rest[rest.length - 1] === 'RateLimit') this.errors.push(String(message));
  }
  warn(message: unknown, context?: unknown) {
    if (context === 'RateLimit') this.warnings.push(String(message));
  }
}

/**
 * Nothing listens on Redis's port when the application starts: it must start anyway, follow the
 * failure mode, and use Redis once a server appears on that port.
 */
describe.each(PLATFORMS)('Redis unreachable at start-up on %s', (platform) => {
  describe.each(MODES)("failureMode '%s'", (mode) => {
    const prefix = testPrefix(`redis-unreachable-${platform}-${mode}`);
    const recorder = new WarningRecorder();
    // A free port of its own, left closed until the recovery test.
    const fx = appOnOwnRedis(
      platform,
      { keyPrefix: prefix, failureMode: mode, timeoutMs: TIMEOUT_MS },
      { serverDown: true, configure: (nest) => nest.useLogger(recorder) },
    );

    it('starts after waiting at most about a second for Redis, and says it goes on without it', () => {
      figure(`${platform}/${mode} start-up without Redis (ms)`, fx.startUpMs.toFixed(0));
      expect(fx.startUpMs).toBeLessThan(CONNECT_WAIT_MS + 2_000);
      // The refused connection is an outage, not a misconfiguration: one error-level line with its
      // address and cause, then the module goes on without it.
      expect(recorder.errors).toHaveLength(1);
      expect(recorder.errors[0]).toMatch(
        new RegExp(
          `^Redis at 127\\.0\\.0\\.1:\\d+ is not reachable at start-up: connection refused .*; starting anyway: decisions follow failureMode '${mode}' until it answers$`,
        ),
      );
    });

    it(`answers the first requests as '${mode}' says, each decided within timeoutMs (+ ${SLACK_MS} ms, in the app and over a control route)`, async () => {
      await untilConclusive(`${platform}/${mode} before Redis`, async (n) => {
        const loop = watchLoopDelay();
        const decisions = timeDecisions(fx.app);
        try {
          const sentAt = performance.now();
          const pairs = await pairedBurst(fx.url, `before-redis-${n}`, CAPACITY + 3);
          loop.stop();
          decisions.restore();
          expectOutageBurst(
            mode,
            pairs.map((p) => p.limited),
          );
          expect(decisions.spans).toHaveLength(pairs.length);
          const judgements = [judgeDecisions(decisions.spans, sentAt, TIMEOUT_MS, loop), judgePairs(pairs, sentAt, TIMEOUT_MS, loop)];
          timingFigure(`${platform}/${mode} before Redis run ${n + 1}`, judgements, loop);
          return judgements;
        } finally {
          loop.stop();
          decisions.restore();
        }
      });
    });

    it('limits through Redis once a server starts on its port, without restarting the app', async () => {
      await fx.server.start();
      fx.client = await inspector(fx.server.url);
      const tookMs = await untilRedisDecides(fx.url, fx.client, prefix);
      figure(`${platform}/${mode} Redis started late: decides after (ms)`, tookMs);
      await expectRedisLimitsBurst(fx.url, fx.client, prefix, 'after-start');
    });
  });
});
