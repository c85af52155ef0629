import { Module } from '@nestjs/common';
import { RateLimitModule } from 'nest-redis-rate-limit';
import { AddressesController } from './addresses.controller.js';

export function addressesAppModule(redis: string, keyPrefix: string) {
  @Module({ imports: [RateLimitModule.forRoot({ redis, keyPrefix })], controllers: [AddressesController] })
  class AddressesAppModule {}
  return AddressesAppModule;
}
