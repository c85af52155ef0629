import { Module } from '@nestjs/common';
import { ConfigModule, ConfigService } from '@nestjs/config';
import { RateLimitModule } from 'nest-redis-rate-limit';
import { AuthController } from './auth.controller.js';
import { HealthController } from './health.controller.js';
import { HelloController } from './hello.controller.js';
import { QuotaController } from './quota.controller.js';
import { gatewayRateLimitOptions } from './redis-probe.js';

@Module({
  imports: [
    ConfigModule.forRoot({ isGlobal: true }),
    RateLimitModule.forRootAsync({
      imports: [ConfigModule],
      inject: [ConfigService],
      useFactory: (config: ConfigService) =>
        gatewayRateLimitOptions(
          config.get<string>('REDIS_URL') ?? 'redis://127.0.0.1:6379',
          config.get<string>('RATE_LIMIT_PREFIX'),
        ),
    }),
  ],
  controllers: [HelloController, AuthController, QuotaController, HealthController],
})
export class AppModule {}
