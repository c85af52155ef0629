import { Module } from '@nestjs/common';
import { RateLimitModule, type RateLimitModuleOptions } from 'nest-redis-rate-limit';
import { LimitedController } from './limited.controller.js';

export function headersAppModule(options: RateLimitModuleOptions) {
  @Module({ imports: [RateLimitModule.forRoot(options)], controllers: [LimitedController] })
  class HeadersAppModule {}
  return HeadersAppModule;
}
