import { Module } from '@nestjs/common';
import { APP_GUARD, DiscoveryModule } from '@nestjs/core';
import { BucketService } from './bucket/bucket.service.js';
import { RateLimitGuard } from './guards/rate-limit.guard.js';
import { RateLimitHeadersWriter } from './headers/rate-limit-headers.writer.js';
import { PolicyRegistry } from './policies/policy-registry.js';
import {
  ConfigurableRateLimitModule,
  RATE_LIMIT_MODULE_OPTIONS,
  RATE_LIMIT_OPTIONS,
} from './rate-limit.module-definition.js';
import type { RateLimitModuleOptions, ResolvedRateLimitOptions } from './rate-limit.options.js';
import { resolveOptions } from './rate-limit.options-resolver.js';
import { BucketStore } from './stores/bucket-store.interface.js';
import { MemoryBucketStore } from './stores/memory-bucket.store.js';
import { createRedisClient, RedisBucketStore } from './stores/redis-bucket.store.js';

function createStore(options: ResolvedRateLimitOptions): BucketStore {
  if (options.store === 'memory') return new MemoryBucketStore();
  const { client, owned } = createRedisClient(options.redis);
  return new RedisBucketStore(client, owned);
}

/**
 * Distributed token-bucket rate limiting. `forRoot()` / `forRootAsync()` provide `BucketService` and
 * register the guard (which also writes the headers) for the whole application, so `@RateLimit()` on a
 * controller is all a route needs. No interceptor is registered: one on every route of the app would
 * cost more than the limiter itself.
 */
@Module({
  imports: [DiscoveryModule],
  providers: [
    {
      provide: RATE_LIMIT_OPTIONS,
      useFactory: (options: RateLimitModuleOptions) => resolveOptions(options),
      inject: [RATE_LIMIT_MODULE_OPTIONS],
    },
    { provide: BucketStore, useFactory: createStore, inject: [RATE_LIMIT_OPTIONS] },
    BucketService,
    PolicyRegistry,
    RateLimitHeadersWriter,
    { provide: APP_GUARD, useClass: RateLimitGuard },
  ],
  exports: [BucketService],
})
export class RateLimitModule extends ConfigurableRateLimitModule {}
