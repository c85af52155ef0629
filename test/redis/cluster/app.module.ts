import { Module } from '@nestjs/common';
import { RateLimitModule, type RateLimitModuleOptions } from 'nest-redis-rate-limit';
import { ClusterController } from './cluster.controller.js';

export function clusterAppModule(options: RateLimitModuleOptions) {
  @Module({ imports: [RateLimitModule.forRoot(options)], controllers: [ClusterController] })
  class ClusterAppModule {}
  return ClusterAppModule;
}
