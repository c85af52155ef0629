import { Module } from '@nestjs/common';
import { RateLimitModule } from '../../../libs/rate-limit/src/index.js';
import { WorkerController } from './worker.controller.js';

/** The module defaults except where the Redis is and the key prefix every process of one test shares. */
export function workerAppModule(redis: string, keyPrefix: string) {
  @Module({ imports: [RateLimitModule.forRoot({ redis, keyPrefix })], controllers: [WorkerController] })
  class WorkerAppModule {}
  return WorkerAppModule;
}
