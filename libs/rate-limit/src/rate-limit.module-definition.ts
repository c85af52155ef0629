import { ConfigurableModuleBuilder } from '@nestjs/common';
import type { RateLimitModuleOptions } from './rate-limit.options.js';

export const {
  ConfigurableModuleClass: ConfigurableRateLimitModule,
  MODULE_OPTIONS_TOKEN: RATE_LIMIT_MODULE_OPTIONS,
  OPTIONS_TYPE: RATE_LIMIT_OPTIONS_TYPE,
  ASYNC_OPTIONS_TYPE: RATE_LIMIT_ASYNC_OPTIONS_TYPE,
} = new ConfigurableModuleBuilder<RateLimitModuleOptions>({ moduleName: 'RateLimit' })
  .setClassMethodName('forRoot')
  .setFactoryMethodName('createRateLimitOptions')
  .setExtras({ isGlobal: false }, (definition, extras) => ({ ...definition, global: extras.isGlobal }))
  .build();

/** Injection token of the options with every default applied (`ResolvedRateLimitOptions`). */
export const RATE_LIMIT_OPTIONS = Symbol('RATE_LIMIT_OPTIONS');

/** What a `forRootAsync({ useClass })` / `useExisting` class implements. */
export interface RateLimitOptionsFactory {
  createRateLimitOptions(): RateLimitModuleOptions | Promise<RateLimitModuleOptions>;
}

/** What `forRootAsync()` takes: `imports`, `inject`, and `useFactory`, `useClass` or `useExisting` (plus `isGlobal`). */
export type RateLimitModuleAsyncOptions = typeof RATE_LIMIT_ASYNC_OPTIONS_TYPE;
