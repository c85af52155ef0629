import { Module } from '@nestjs/common';
import { RateLimitModule } from '../../../libs/rate-limit/src/index.js';
import { ConcurrencyWorkerController } from './concurrency.controller.js';
import { WorkerController } from './worker.controller.js';

/**
 * The module defaults except where the Redis is, the key prefix every process of one test shares, and
 * failures: the tests are about exactness, so a decision that timed out under load answers 503 (a
 * failure the driver reports) instead of an admission, and the timeout is generous (2 s unless a test
 * asks for another).
 */
export function workerAppModule(redis: string, keyPrefix: string, timeoutMs = 2_000) {
  @Module({
    imports: [RateLimitModule.forRoot({ redis, keyPrefix, failureMode: 'closed', timeoutMs })],
    controllers: [WorkerController, ConcurrencyWorkerController],
  })
  class WorkerAppModule {}
  return WorkerAppModule;
}
