import { Module } from '@nestjs/common';
import { RateLimitModule } from '../../../libs/rate-limit/src/index.js';
import { WorkerController } from './worker.controller.js';

/**
 * The module defaults except where the Redis is, the key prefix every process of one test shares, and
 * failures: the tests are about exactness, so a decision that timed out under load answers 503 (a
 * failure the driver reports) instead of an admission, and the timeout is generous.
 */
export function workerAppModule(redis: string, keyPrefix: string) {
  @Module({
    imports: [RateLimitModule.forRoot({ redis, keyPrefix, failureMode: 'closed', timeoutMs: 2000 })],
    controllers: [WorkerController],
  })
  class WorkerAppModule {}
  return WorkerAppModule;
}
