import { Injectable, Logger, Module } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { RateLimit, RateLimitModule } from 'nest-redis-rate-limit';
import { LogRecorder } from '../support/log-recorder.js';
import { redisUrl, testPrefix } from '../support/redis.js';

/**
 * A WebSocket gateway handler as the limiter sees it: a provider's method carrying the metadata
 * `@SubscribeMessage` writes ('websockets:message_mapping'), set by hand so that the test needs no
 * @nestjs/websockets. The limiter cannot decide such a handler: its policy must be reported, not
 * silently ignored (issue 13, item 4).
 */
@Injectable()
class ChatGatewayLike {
  @RateLimit(5, 1)
  message() {
    return 'sent';
  }

  /** No policy: nothing to report. */
  typing() {
    return 'typing';
  }
}
Reflect.defineMetadata('websockets:message_mapping', true, ChatGatewayLike.prototype.message);
Reflect.defineMetadata('websockets:message_mapping', true, ChatGatewayLike.prototype.typing);

describe('a policy on a handler the limiter cannot decide', () => {
  const recorder = new LogRecorder();

  afterAll(() => Logger.overrideLogger(false));

  it('is reported at start-up: "is not enforced", once, naming the handler', async () => {
    @Module({
      imports: [RateLimitModule.forRoot({ redis: await redisUrl(), keyPrefix: testPrefix('graphql-undecided') })],
      providers: [ChatGatewayLike],
    })
    class UndecidedAppModule {}
    const moduleRef = await Test.createTestingModule({ imports: [UndecidedAppModule] }).compile();
    Logger.overrideLogger(recorder);
    const app = moduleRef.createNestApplication({ logger: recorder });
    try {
      await app.init();
      const warnings = recorder.of('RateLimit', 'warn');
      const reports = warnings.filter((line) => line.includes('is not enforced'));
      expect(reports).toHaveLength(1);
      expect(reports[0]).toContain('ChatGatewayLike.message');
      expect(reports[0]).toContain('WebSocket');
      expect(warnings.some((line) => line.includes('ChatGatewayLike.typing'))).toBe(false);
    } finally {
      await app.close();
    }
  });
});
