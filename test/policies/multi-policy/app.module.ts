import { Module } from '@nestjs/common';
import { RateLimitModule, type RateLimitModuleOptions } from 'nest-redis-rate-limit';
import { MultiPolicyController } from './multi-policy.controller.js';

export function multiPolicyAppModule(options: RateLimitModuleOptions) {
  @Module({ imports: [RateLimitModule.forRoot(options)], controllers: [MultiPolicyController] })
  class MultiPolicyAppModule {}
  return MultiPolicyAppModule;
}
