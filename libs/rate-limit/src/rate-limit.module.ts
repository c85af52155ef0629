import { type CanActivate, type DynamicModule, Module } from '@nestjs/common';
import { APP_GUARD, APP_INTERCEPTOR, DiscoveryModule, ModuleRef } from '@nestjs/core';
import { BucketService } from './bucket/bucket.service.js';
import { RateLimitHealth } from './operations/rate-limit-health.js';
import { LiveOperations } from './operations/live-operations.js';
import { RateLimitInsights } from './operations/rate-limit-insights.js';
import { RateLimitGuard } from './guards/rate-limit.guard.js';
import { RateLimitHeadersWriter } from './headers/rate-limit-headers.writer.js';
import { RateLimitInterceptor } from './interceptors/rate-limit.interceptor.js';
import { RateLimitEvents } from './events/rate-limit-events.js';
import { RateLimitMetrics } from './metrics/rate-limit-metrics.js';
import { needsInterceptor } from './policies/policy.js';
import { RATE_LIMIT_ENHANCER, RATE_LIMIT_GUARD_REPLACED } from './rate-limit.constants.js';
import { PolicyRegistry } from './policies/policy-registry.js';
import { PolicyRouteBuckets } from './policies/policy-route-buckets.js';
import { RouteBuckets } from './bucket/route-buckets.js';
import {
  ConfigurableRateLimitModule,
  RATE_LIMIT_MODULE_OPTIONS,
  RATE_LIMIT_OPTIONS,
  type RATE_LIMIT_OPTIONS_TYPE,
} from './rate-limit.module-definition.js';
import type { RateLimitModuleOptions, ResolvedRateLimitOptions } from './rate-limit.options.js';
import { resolveOptions } from './rate-limit.options-resolver.js';
import { RouteLimiter } from './pipeline/route-limiter.js';
import { StartupChecks } from './pipeline/startup-checks.js';
import { BucketStore } from './stores/bucket-store.interface.js';
import { CustomBucketStore } from './stores/custom-bucket.store.js';
import { localStoreOptions, MemoryBucketStore } from './stores/memory/memory-bucket.store.js';
import { TransportHandlers } from './interceptors/transport-handlers.js';
import { createRedisClient } from './stores/redis/redis-client.js';
import { RedisBucketStore } from './stores/redis/redis-bucket.store.js';
import { RateLimitConfigError } from './errors/rate-limit.errors.js';

function createStore(options: ResolvedRateLimitOptions): BucketStore {
  if (typeof options.store === 'object') return new CustomBucketStore(options.store);
  if (options.store === 'memory') return new MemoryBucketStore(localStoreOptions(options, "store: 'memory'"));
  const { client, owned } = createRedisClient(options.redis);
  const { startupCheck: mode, keyPrefix, failureMode } = options;
  return new RedisBucketStore(client, owned, options.coalesce, { mode, keyPrefix, failureMode });
}

/** Module `defaults` with a policy decided after the app's guards, or refunded after the handler, need the interceptor on every route. */
function defaultsNeedInterceptor(options: ResolvedRateLimitOptions): boolean {
  const apiKeyVerified = options.apiKey !== undefined;
  return options.defaults.some(
    (policy) => needsInterceptor(policy) || (policy.keyBy === 'apiKey' && policy.phase === undefined && apiKeyVerified),
  );
}

function createEvents(options: ResolvedRateLimitOptions): RateLimitEvents {
  const events = new RateLimitEvents();
  if (options.onDecision) events.onDecision(options.onDecision);
  return events;
}

function requireOptions(options: RateLimitModuleOptions | undefined): ResolvedRateLimitOptions {
  if (options === undefined) {
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_MODULE_WITHOUT_OPTIONS',
      'RateLimitModule was imported without options: use RateLimitModule.forRoot({ ... }) or ' +
        'RateLimitModule.forRootAsync({ ... }) in the imports of your root module',
    );
  }
  return resolveOptions(options);
}

/**
 * Distributed token-bucket rate limiting. `forRoot()` / `forRootAsync()` provide `BucketService`, register
 * `RateLimitGuard` for the whole application (unless `guard: false`), and — only when `defaults` have a
 * policy decided after the app's guards or refunded after the handler — `RateLimitInterceptor` too;
 * `@RateLimit()` applies the interceptor where its policies may need it, and `TransportHandlers` puts it
 * on WebSocket and microservice handlers with a policy.
 */
@Module({
  imports: [DiscoveryModule],
  providers: [
    {
      provide: RATE_LIMIT_OPTIONS,
      useFactory: requireOptions,
      inject: [{ token: RATE_LIMIT_MODULE_OPTIONS, optional: true }],
    },
    { provide: BucketStore, useFactory: createStore, inject: [RATE_LIMIT_OPTIONS] },
    { provide: RateLimitEvents, useFactory: createEvents, inject: [RATE_LIMIT_OPTIONS] },
    BucketService,
    // Is the limiter limiting right now: a status, and a health indicator in @nestjs/terminus' shape.
    RateLimitHealth,
    // The operator's side (operations): overrides and blocks in force, the periodic call, the analytics.
    LiveOperations,
    RateLimitInsights,
    // Subscribes to RateLimitEvents at bootstrap, only when an OpenTelemetry SDK's MeterProvider is found.
    RateLimitMetrics,
    PolicyRegistry,
    // What BucketService.peekRoute() / resetRoute() ask: the route policies' buckets by scope.
    { provide: RouteBuckets, useClass: PolicyRouteBuckets },
    RateLimitHeadersWriter,
    RouteLimiter,
    // Checks the routes and the app's set-up at start-up; one that fails stops the start.
    StartupChecks,
    // Puts RateLimitInterceptor on WebSocket and microservice handlers with a policy, at creation.
    TransportHandlers,
    // A provider of its own, so that @nestjs/testing's overrideGuard(RateLimitGuard) replaces the global guard.
    RateLimitGuard,
    // A factory that gives null registers nothing: Nest skips it (`guard: false`).
    {
      provide: APP_GUARD,
      useFactory: (options: ResolvedRateLimitOptions, guard: CanActivate) => (options.guard ? guard : null),
      inject: [RATE_LIMIT_OPTIONS, RateLimitGuard],
    },
    // A test that replaced the guard with a stub switches the interceptor's policies off too.
    {
      provide: RATE_LIMIT_GUARD_REPLACED,
      useFactory: (options: ResolvedRateLimitOptions, guard: CanActivate) => options.guard && !(RATE_LIMIT_ENHANCER in guard.constructor),
      inject: [RATE_LIMIT_OPTIONS, RateLimitGuard],
    },
    {
      provide: APP_INTERCEPTOR,
      useFactory: (options: ResolvedRateLimitOptions, moduleRef: ModuleRef) =>
        defaultsNeedInterceptor(options) ? new RateLimitInterceptor(moduleRef) : null,
      inject: [RATE_LIMIT_OPTIONS, ModuleRef],
    },
  ],
  exports: [BucketService, RateLimitHealth, RateLimitInsights],
})
export class RateLimitModule extends ConfigurableRateLimitModule {
  /** `forRoot()` without options uses every default (Redis at 127.0.0.1:6379). */
  static override forRoot(options: typeof RATE_LIMIT_OPTIONS_TYPE = {}): DynamicModule {
    return super.forRoot(options);
  }
}
