import { createHash } from 'node:crypto';
import { Module } from '@nestjs/common';
import { RateLimitModule, type RateLimitModuleOptions } from 'nest-redis-rate-limit';
import { ControlController, FailureController, SCOPE } from './failure.controller.js';

export function failureAppModule(options: RateLimitModuleOptions) {
  @Module({ imports: [RateLimitModule.forRoot(options)], controllers: [FailureController, ControlController] })
  class FailureAppModule {}
  return FailureAppModule;
}

/** The Redis key of an API key's bucket on the limited route, written out as DESIGN.md specifies it. */
export function bucketKey(prefix: string, apiKey: string): string {
  return `${prefix}{key:${createHash('sha256').update(apiKey).digest('hex').slice(0, 32)}}:${SCOPE}`;
}
