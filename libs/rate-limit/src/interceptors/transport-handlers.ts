import { Inject, Injectable, type OnModuleInit, type Type } from '@nestjs/common';
import { INTERCEPTORS_METADATA } from '@nestjs/common/constants.js';
import { DiscoveryService, MetadataScanner, ModuleRef } from '@nestjs/core';
import { RateLimitInterceptor } from './rate-limit.interceptor.js';
import { handlerKind } from '../policies/policy-registry.js';
import { RATE_LIMIT_CONCURRENCY, RATE_LIMIT_POLICIES, RATE_LIMIT_SKIP } from '../rate-limit.constants.js';
import { RATE_LIMIT_OPTIONS } from '../rate-limit.module-definition.js';
import type { ResolvedRateLimitOptions } from '../rate-limit.options.js';
import { loadTransportErrors } from '../pipeline/refusals.js';

/**
 * WebSocket and microservice handlers with a policy get `RateLimitInterceptor` on the handler itself,
 * so they are limited however the app runs them: a global guard does not reach the handlers of a
 * microservice connected with `connectMicroservice()` unless `inheritAppConfig` is set, but a
 * handler's own interceptor always runs. Done when the module's providers are created, before Nest
 * connects gateways and microservices (it reads each handler's enhancers then, once). Where the global
 * guard does run, it decides the policies due before the app's guards, as on routes.
 */
@Injectable()
export class TransportHandlers implements OnModuleInit {
  private readonly kinds = new Set<'ws' | 'rpc'>();

  constructor(
    @Inject(RATE_LIMIT_OPTIONS) options: ResolvedRateLimitOptions,
    discovery: DiscoveryService,
    scanner: MetadataScanner,
    moduleRef: ModuleRef,
  ) {
    let interceptor: RateLimitInterceptor | undefined;
    for (const wrapper of [...discovery.getControllers(), ...discovery.getProviders()]) {
      const type = wrapper.metatype as Type | null;
      if (!type || typeof type !== 'function' || !type.prototype) continue;
      for (const name of scanner.getAllMethodNames(type.prototype)) {
        const handler = type.prototype[name] as Function;
        const kind = handlerKind(handler);
        if (kind !== 'ws' && kind !== 'rpc') continue;
        // Every transport the app uses, limited or not: a global guard may decide a handler found later.
        this.kinds.add(kind);
        if (!mayBeLimited(type, handler, options)) continue;
        const list: unknown[] = Reflect.getMetadata(INTERCEPTORS_METADATA, handler) ?? [];
        // The class itself (@UseInterceptors(RateLimitInterceptor)) is Nest's to build for each app.
        if (list.includes(RateLimitInterceptor)) continue;
        // An instance finds the limiter of the app that created it. A handler class shared by several
        // apps in one process (an e2e suite) gets this app's instance in place of an earlier app's:
        // Nest reads a handler's enhancers once, when it connects the app's gateways and microservices,
        // so an app that has started keeps its own.
        interceptor ??= new RateLimitInterceptor(moduleRef);
        Reflect.defineMetadata(
          INTERCEPTORS_METADATA,
          [...list.filter((item) => !(item instanceof RateLimitInterceptor)), interceptor],
          handler,
        );
      }
    }
  }

  /** The transports' own exception classes, before the first message can arrive. */
  async onModuleInit(): Promise<void> {
    if (this.kinds.size > 0) await loadTransportErrors(this.kinds);
  }
}

/** A policy of its own, of its class, or the module defaults, and not `@SkipRateLimit()` as a whole. */
function mayBeLimited(type: Function, handler: Function, options: ResolvedRateLimitOptions): boolean {
  if (Reflect.getMetadata(RATE_LIMIT_SKIP, handler) === true) return false;
  if (Reflect.hasMetadata(RATE_LIMIT_POLICIES, handler) || Reflect.hasMetadata(RATE_LIMIT_CONCURRENCY, handler)) return true;
  if (Reflect.getMetadata(RATE_LIMIT_SKIP, type) === true && Reflect.getMetadata(RATE_LIMIT_SKIP, handler) !== false) return false;
  return Reflect.hasMetadata(RATE_LIMIT_POLICIES, type) || Reflect.hasMetadata(RATE_LIMIT_CONCURRENCY, type) || options.defaults.length > 0;
}
