import { Module } from '@nestjs/common';
import { RateLimitModule, type RateLimitModuleOptions } from 'nest-redis-rate-limit';
import { MeteredController } from './metered.controller.js';

export function metricsAppModule(options: RateLimitModuleOptions) {
  @Module({ imports: [RateLimitModule.forRoot(options)], controllers: [MeteredController] })
  class MetricsAppModule {}
  return MetricsAppModule;
}
