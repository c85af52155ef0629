import { Module } from '@nestjs/common';
import { ConfigModule, ConfigService } from '@nestjs/config';
import { ApolloDriver, type ApolloDriverConfig } from '@nestjs/apollo';
import { GraphQLModule } from '@nestjs/graphql';
import { RateLimitDashboardModule, RateLimitModule } from 'nest-redis-rate-limit';
import { apiKeyVerifier } from './api-keys.js';
import { AuthController } from './auth.controller.js';
import { DashboardTokenGuard } from './dashboard.guard.js';
import { HealthController } from './health.controller.js';
import { HelloController } from './hello.controller.js';
import { MetricsController } from './metrics.controller.js';
import { PlanController } from './plan.controller.js';
import { DemoUserGuard, DemoUsers, PlanLimits } from './plans.js';
import { EchoGateway } from './echo.gateway.js';
import { FakePartner } from './fake-partner.js';
import { PartnerClient } from './partner.client.js';
import { PartnerController } from './partner.controller.js';
import { StorefrontController } from './storefront.controller.js';
import { QuotaController } from './quota.controller.js';
import { QUOTES_SCHEMA, QuotesResolver } from './quotes.resolver.js';
import { gatewayRateLimitOptions } from './redis-probe.js';

@Module({
  imports: [
    ConfigModule.forRoot({ isGlobal: true }),
    // GraphQL at /graphql (Apollo): resolvers are limited like routes. The context keeps the HTTP response
    // for the rate-limit headers: Express passes { req, res }; Fastify passes (request, reply).
    GraphQLModule.forRoot<ApolloDriverConfig>({
      driver: ApolloDriver,
      typeDefs: QUOTES_SCHEMA,
      path: '/graphql',
      context: (first: object, reply?: object) => (reply === undefined ? first : { req: first, reply }),
    }),
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
        // Who is limited, live overrides and blocks: what the dashboard below shows and changes.
        operations: true,
      }),
    }),
    // The operator's page at /rate-limit, behind the demo's admin auth (HTTP Basic, DASHBOARD_TOKEN).
    RateLimitDashboardModule.register({ path: 'rate-limit', guard: DashboardTokenGuard }),
  ],
  controllers: [
    HelloController,
    AuthController,
    PlanController,
    QuotaController,
    HealthController,
    MetricsController,
    PartnerController,
    StorefrontController,
  ],
  providers: [DemoUsers, DemoUserGuard, PlanLimits, QuotesResolver, EchoGateway, FakePartner, PartnerClient],
})
export class AppModule {}
