import { Module } from '@nestjs/common';
import { ConfigModule, ConfigService } from '@nestjs/config';
import { RateLimitModule } from 'nest-redis-rate-limit';
import { apiKeyVerifier } from './api-keys.js';
import { AuthController } from './auth.controller.js';
import { HealthController } from './health.controller.js';
import { HelloController } from './hello.controller.js';
import { MetricsController } from './metrics.controller.js';
import { PlanController } from './plan.controller.js';
import { DemoUserGuard, DemoUsers, PlanLimits } from './plans.js';
import { QuotaController } from './quota.controller.js';
import { gatewayRateLimitOptions } from './redis-probe.js';

@Module({
  imports: [
    ConfigModule.forRoot({ isGlobal: true }),
    RateLimitModule.forRootAsync({
      imports: [ConfigModule],
      inject: [ConfigService],
      useFactory: async (config: ConfigService) => ({
        ...(await gatewayRateLimitOptions(
          config.get<string>('REDIS_URL') ?? 'redis://127.0.0.1:6379',
          config.get<string>('RATE_LIMIT_PREFIX'),
        )),
        // Only keys this gateway issued get a bucket of their own; a made-up key counts as its sender's IP.
        keys: { apiKey: apiKeyVerifier(config.get<string>('API_KEYS') ?? 'demo,partner') },
      }),
    }),
  ],
  controllers: [HelloController, AuthController, PlanController, QuotaController, HealthController, MetricsController],
  providers: [DemoUsers, DemoUserGuard, PlanLimits],
})
export class AppModule {}
