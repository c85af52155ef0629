import { Inject, Injectable, type OnApplicationBootstrap, type OnModuleInit } from '@nestjs/common';
import { GUARDS_METADATA, INTERCEPTORS_METADATA } from '@nestjs/common/constants.js';
import { ApplicationConfig, ModuleRef, ModulesContainer } from '@nestjs/core';
import { handlerKind, PolicyRegistry } from '../policies/policy-registry.js';
import { RATE_LIMIT_OPTIONS } from '../rate-limit.module-definition.js';
import type { ResolvedRateLimitOptions } from '../rate-limit.options.js';
import { BucketStore } from '../stores/bucket-store.interface.js';
import { holdsSlots } from '../stores/slots.js';
import { checkFieldResolvers } from './field-resolver-check.js';
import { RouteLimiter } from './route-limiter.js';
import { isOurs } from './setup-warnings.js';
import { RateLimitConfigError } from '../errors/rate-limit.errors.js';

/**
 * What is checked once, at start-up: the routes' policies (compiled and checked as the routes are
 * found), one import of the module, a limited route that nothing would limit, raw API keys, GraphQL
 * field resolvers, and every resolver of per-request numbers built. A check that fails stops the start.
 */
@Injectable()
export class StartupChecks implements OnModuleInit, OnApplicationBootstrap {
  constructor(
    private readonly registry: PolicyRegistry,
    private readonly limiter: RouteLimiter,
    @Inject(RATE_LIMIT_OPTIONS) private readonly options: ResolvedRateLimitOptions,
    private readonly modules: ModulesContainer,
    private readonly config: ApplicationConfig,
    @Inject(BucketStore) private readonly store: BucketStore,
    private readonly moduleRef: ModuleRef,
  ) {}

  onModuleInit(): void {
    this.atStart(() => {
      this.registry.discoverRoutes();
      this.assertImportedOnce();
      this.assertSlotsHeld();
    });
    this.warnRawApiKeys();
  }

  /** Global guards and interceptors are all known by now, `useGlobalGuards()` ones included. */
  async onApplicationBootstrap(): Promise<void> {
    await this.atStart(async () => {
      if (!this.options.guard) this.assertEveryLimitedRouteRuns();
      const fields = checkFieldResolvers(this.moduleRef, this.registry.routes());
      if (fields.refused.length > 0) {
        const more = fields.refused.length - 1;
        throw new RateLimitConfigError(
          'ERR_RATE_LIMIT_FIELD_RESOLVER_UNENFORCED',
          more === 0 ? fields.refused[0] : `${fields.refused[0]} (and ${more} more field resolver${more === 1 ? '' : 's'} alike)`,
        );
      }
      for (const warning of fields.warnings) this.limiter.warnings.once(warning, warning);
      // Every resolver is built now: one Nest cannot build stops the start, naming its route.
      for (const { plan } of this.registry.routes()) {
        for (const policy of plan?.policies ?? []) {
          if (policy.dynamic?.resolve) await this.limiter.numbers.resolver(policy.dynamic.resolve, plan!.route);
        }
      }
    });
  }

  /** A route with `@ConcurrencyLimit` needs a store with slots: a store of your own may have none. */
  private assertSlotsHeld(): void {
    if (holdsSlots(this.store)) return;
    for (const { plan } of this.registry.routes()) {
      if (plan?.concurrency === undefined) continue;
      throw new RateLimitConfigError(
        'ERR_RATE_LIMIT_CONCURRENCY_UNSUPPORTED',
        `@ConcurrencyLimit on ${plan.route}: the module's store has no concurrency slots (takeSlot and giveBackSlot)`,
      );
    }
  }

  /**
   * Runs start-up checks. One that fails stops the start, and Nest then calls no shutdown hook: the
   * store's own Redis connection is dropped first, so that `bootstrap().catch(log)` does not leave a
   * process that neither serves nor exits.
   */
  private atStart<T>(checks: () => T): T {
    const abandon = (error: unknown): never => {
      this.store.abandon?.();
      throw error;
    };
    try {
      const result = checks();
      return (result instanceof Promise ? result.catch(abandon) : result) as T;
    } catch (error) {
      return abandon(error);
    }
  }

  /**
   * Without `keys.apiKey`, an API key is whatever the client sends: a new made-up key per request is a
   * new bucket per request. Said once at start-up, naming the routes that no enforced per-IP policy bounds.
   */
  private warnRawApiKeys(): void {
    if (this.options.apiKey !== undefined) return;
    const routes = new Set<string>();
    for (const { plan } of this.registry.routes()) {
      const policies = plan?.policies ?? [];
      const byKey = policies.some((policy) => policy.keyBy === 'apiKey');
      const byIp = policies.some((policy) => policy.keyBy === 'ip' && policy.enforce);
      if (byKey && !byIp) routes.add(plan!.route);
    }
    if (routes.size === 0) return;
    this.limiter.warnings.once(
      'raw-api-key',
      `keyBy 'apiKey' on ${[...routes].join(', ')} trusts the ${this.options.apiKeyHeader} header as sent (keys.apiKey ` +
        'is not set): a client that invents a new key for each request gets a new bucket each time, so these routes ' +
        'are not limited. Set keys: { apiKey: (req) => ... } to look the key up and return undefined for an unknown ' +
        "one (it then counts as its sender's IP), or stack a per-IP @RateLimit beside it",
    );
  }

  /**
   * With `guard: false`, a limited route on which neither `RateLimitGuard` nor `RateLimitInterceptor`
   * runs would not be limited at all: refuse to start, naming the routes.
   */
  private assertEveryLimitedRouteRuns(): void {
    const global = [...this.config.getGlobalGuards(), ...this.config.getGlobalInterceptors()];
    if (global.some(isOurs)) return;
    const unlimited: string[] = [];
    for (const { controller, handler, plan } of this.registry.routes()) {
      if (plan === null) continue;
      const kind = handlerKind(handler);
      if (kind === 'ws' || kind === 'rpc') continue; // each has RateLimitInterceptor of its own (TransportHandlers)
      const enhancers = [GUARDS_METADATA, INTERCEPTORS_METADATA].flatMap((key) => [
        ...(Reflect.getMetadata(key, controller) ?? []),
        ...(Reflect.getMetadata(key, handler) ?? []),
      ]);
      if (!enhancers.some(isOurs)) unlimited.push(plan.route);
    }
    if (unlimited.length === 0) return;
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_GUARD_NOT_REGISTERED',
      `RateLimitModule.forRoot({ guard: false }), but no RateLimitGuard runs on ${unlimited.join(', ')}: ` +
        'their @RateLimit policies would not be enforced. Register RateLimitGuard (APP_GUARD, ' +
        'app.useGlobalGuards() or @UseGuards()) or remove guard: false',
    );
  }

  /**
   * Each `forRoot()` brings its own guard, store and connection: a second one would count every request
   * twice, against settings nobody can tell apart.
   */
  private assertImportedOnce(): void {
    const modules = [...this.modules.values()];
    const hosts = modules.filter((module) => module.providers.has(StartupChecks));
    if (hosts.length < 2) return;
    const importers = modules
      .filter((module) => [...module.imports].some((imported) => hosts.includes(imported)))
      .map((module) => module.metatype?.name ?? '(unnamed module)');
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_MODULE_IMPORTED_TWICE',
      `RateLimitModule.forRoot() / forRootAsync() is imported ${hosts.length} times (by ${importers.join(', ')}): ` +
        'each import registers its own guard and Redis connection, so requests would be limited twice. Import it ' +
        'once, in your root module, and add isGlobal: true to inject BucketService in other modules',
    );
  }
}
