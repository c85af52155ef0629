import {
  type CanActivate,
  type ExecutionContext,
  Inject,
  Injectable,
  ServiceUnavailableException,
} from '@nestjs/common';
import { BucketService, type Verdict } from '../bucket/bucket.service.js';
import type { BucketRequest } from '../bucket/token-bucket.js';
import { RateLimitHeadersWriter } from '../headers/rate-limit-headers.writer.js';
import { apiKeyIdentity, identity, ipIdentity, routeKey } from '../keys/identity.js';
import type { CompiledPolicy } from '../policies/policy.js';
import { PolicyRegistry } from '../policies/policy-registry.js';
import { RATE_LIMIT_VERDICT } from '../rate-limit.constants.js';
import { RateLimitException } from '../rate-limit.exception.js';
import type { KeyBy } from '../rate-limit.interfaces.js';
import { RATE_LIMIT_OPTIONS } from '../rate-limit.module-definition.js';
import type { ResolvedRateLimitOptions } from '../rate-limit.options.js';
import { ThrottledLogger } from '../throttled-logger.js';

/** What the guard leaves on the request (under `RATE_LIMIT_VERDICT`) for code that runs after it. */
export interface RateLimitState {
  policies: readonly CompiledPolicy[];
  verdict: Verdict;
}

/**
 * Registered globally by `RateLimitModule`. Decides every limited HTTP route in one store call, leaves
 * the verdict on the request, writes the headers, and on denial throws the 429. Extend it and override the protected
 * hooks to change how identities are found or how a denial looks.
 */
@Injectable()
export class RateLimitGuard implements CanActivate {
  private readonly logger = new ThrottledLogger('RateLimit');

  constructor(
    protected readonly registry: PolicyRegistry,
    protected readonly buckets: BucketService,
    protected readonly headers: RateLimitHeadersWriter,
    @Inject(RATE_LIMIT_OPTIONS) protected readonly options: ResolvedRateLimitOptions,
  ) {}

  async canActivate(context: ExecutionContext): Promise<boolean> {
    if (context.getType() !== 'http') return true;
    const policies = this.registry.planFor(context.getClass(), context.getHandler());
    if (policies === null) return true;
    const http = context.switchToHttp();
    const request = http.getRequest();
    const requests = await this.bucketRequests(context, request, policies);
    const verdict = await this.buckets.decide(requests);
    const state: RateLimitState = { policies, verdict };
    request[RATE_LIMIT_VERDICT] = state;
    const response = http.getResponse();
    if (verdict.allowed) {
      // Written here, not by an interceptor: a global interceptor costs every request of the app more
      // than the whole decision does (measured in bench/).
      this.headers.write(response, policies, verdict);
      return true;
    }
    if (verdict.source === 'closed') {
      this.headers.writeRetryAfter(response, Math.max(1, Math.ceil(this.options.timeoutMs / 1000)));
      throw new ServiceUnavailableException('Rate limiting is unavailable; try again shortly');
    }
    this.headers.write(response, policies, verdict);
    return this.throwRateLimitException(context, verdict);
  }

  /** Throws the denial. Override to change the body or the exception. */
  protected throwRateLimitException(_context: ExecutionContext, verdict: Verdict): never {
    let retryAfter = 0;
    for (const decision of verdict.decisions) if (decision.retryAfterSeconds > retryAfter) retryAfter = decision.retryAfterSeconds;
    throw RateLimitException.withoutStack(retryAfter);
  }

  /** The client address; honours the app's trust-proxy setting through `req.ip`. */
  protected getIp(request: any): string | undefined {
    return request.ip ?? request.socket?.remoteAddress;
  }

  /** The user id for `keyBy: 'user'`: `keys.user(req)`, else `req.user.id`. */
  protected getUserId(request: any): string | number | undefined {
    return this.options.user ? this.options.user(request) : request.user?.id;
  }

  /** The API key for `keyBy: 'apiKey'`. */
  protected getApiKey(request: any): string | undefined {
    const value = request.headers?.[this.options.apiKeyHeader];
    return Array.isArray(value) ? value[0] : value;
  }

  /** The identity a policy's bucket belongs to. A missing user or API key, or a failing keyBy function, falls back to the IP. */
  protected async getIdentity(context: ExecutionContext, request: any, keyBy: KeyBy): Promise<string> {
    if (keyBy === 'apiKey') {
      const apiKey = this.getApiKey(request);
      if (typeof apiKey === 'string' && apiKey !== '') return apiKeyIdentity(apiKey);
    } else if (keyBy === 'user') {
      let user: unknown;
      try {
        user = this.getUserId(request);
      } catch (error) {
        this.logger.warn(`keys.user threw (${error instanceof Error ? error.message : String(error)}); using the IP bucket`);
      }
      if ((typeof user === 'string' && user !== '') || (typeof user === 'number' && Number.isFinite(user))) {
        return identity('user', String(user));
      }
    } else if (typeof keyBy === 'function') {
      try {
        const value: unknown = await keyBy(context);
        if (typeof value === 'string' && value !== '') return identity('id', value);
        this.logger.warn(
          `keyBy function ${keyBy.name || '(anonymous)'} returned ${value === '' ? 'an empty string' : typeof value}; using the IP bucket`,
        );
      } catch (error) {
        this.logger.warn(
          `keyBy function ${keyBy.name || '(anonymous)'} threw (${error instanceof Error ? error.message : String(error)}); using the IP bucket`,
        );
      }
    }
    return ipIdentity(this.getIp(request));
  }

  private async bucketRequests(
    context: ExecutionContext,
    request: any,
    policies: readonly CompiledPolicy[],
  ): Promise<BucketRequest[]> {
    const requests = new Array<BucketRequest>(policies.length);
    for (let i = 0; i < policies.length; i++) {
      const policy = policies[i];
      const id = await this.getIdentity(context, request, policy.keyBy);
      requests[i] = {
        key: routeKey(this.options.keyPrefix, id, policy.keySuffix),
        capacity: policy.capacity,
        refillPerSecond: policy.refillPerSecond,
        cost: policy.cost,
      };
    }
    return requests;
  }
}
