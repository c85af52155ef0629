import { Module } from '@nestjs/common';
import { RateLimitModule, type RateLimitModuleOptions } from 'nest-redis-rate-limit';
import { RoundTripController } from './round-trip.controller.js';

export function roundTripAppModule(options: RateLimitModuleOptions) {
  @Module({ imports: [RateLimitModule.forRoot(options)], controllers: [RoundTripController] })
  class RoundTripAppModule {}
  return RoundTripAppModule;
}
