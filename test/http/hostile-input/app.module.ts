import { Module } from '@nestjs/common';
import { RateLimitModule } from 'nest-redis-rate-limit';
import { HostileController } from './hostile.controller.js';

/** The user id comes from `x-user`; `x-user-throw` makes the user function throw, as a broken token decoder would. */
export function hostileAppModule(redis: string, keyPrefix: string) {
  @Module({
    imports: [
      RateLimitModule.forRoot({
        redis,
        keyPrefix,
        keys: {
          user: (req) => {
            if (req.headers['x-user-throw'] !== undefined) throw new Error('malformed token');
            return req.headers['x-user'];
          },
        },
      }),
    ],
    controllers: [HostileController],
  })
  class HostileAppModule {}
  return HostileAppModule;
}
