import type { ExecutionContext } from '@nestjs/common';
import type { ClientAddresses } from '../contexts/client-address.js';
import { createDigest, type Digest, ipIdentity, routeIdentity } from '../keys/identity-keys.js';
import { defaultUserId, isUserId } from '../keys/user-identity.js';
import type { CompiledPolicy } from '../policies/policy.js';
import type { RoutePlan } from '../policies/policy-registry.js';
import type { RateLimitIdentity } from '../rate-limit.interfaces.js';
import type { ResolvedRateLimitOptions } from '../rate-limit.options.js';
import type { ThrottledLogger } from '../throttled-logger.js';
import { AddressList } from './allow-list.js';
import { describeError, failure, type HookAnswers } from './hook-answers.js';
import type { RequestHooks, RequestState } from './request-state.js';
import type { SetupWarnings } from './setup-warnings.js';

/** A request's identity for one policy: what kind, its value (for resolvers and allow-lists), and its part of the key. */
export interface Who extends RateLimitIdentity {
  id: string;
}

/** Where a request's identities come from (`RequestHooks`), whose bucket a policy drains, and who is exempt. */
export class Identities {
  private readonly hash: Digest;
  private readonly allowedIps: AddressList;
  /** Identities as the module options define them (the refusal aside: `Refusals`); `RateLimitGuard` subclasses override them. */
  readonly defaults: Omit<RequestHooks, 'throwRateLimitException'>;

  constructor(
    private readonly options: ResolvedRateLimitOptions,
    addresses: ClientAddresses,
    private readonly hooks: HookAnswers,
    private readonly warnings: SetupWarnings,
    private readonly logger: ThrottledLogger,
  ) {
    this.hash = createDigest(options.secret);
    this.allowedIps = new AddressList(options.allowList.ips);
    const apiKeyHeader = options.apiKeyHeader;
    this.defaults = {
      // A request without `ip` is a handshake's (graphql-ws): resolved as the app's platform resolves `req.ip`.
      getIp: (request) => request.ip ?? addresses.ofRequest(request),
      getUserId: options.user ?? defaultUserId,
      getApiKey:
        options.apiKey ??
        ((request) => {
          const value = request.headers?.[apiKeyHeader];
          return Array.isArray(value) ? value[0] : value;
        }),
    };
  }

  /** `allowList.ips`: checked once per request, before anything is decided. */
  isExempt(state: RequestState, request: any): boolean {
    if (this.allowedIps.empty) return (state.exempt = false);
    return (state.exempt = this.allowedIps.has(state.hooks.getIp(request)));
  }

  /** The identity whose bucket a policy drains. A missing user or API key, or a failing hook, falls back to the IP. */
  of(
    context: ExecutionContext,
    request: any,
    plan: RoutePlan,
    policy: Pick<CompiledPolicy, 'keyBy' | 'scope'>,
    hooks: RequestHooks,
  ): Who | Promise<Who> {
    const { keyBy } = policy;
    if (keyBy === 'ip') return ipWho(hooks.getIp(request));
    if (keyBy === 'user') {
      let user: unknown;
      try {
        user = hooks.getUserId(request);
      } catch (error) {
        this.logger.warn(`keys.user threw (${describeError(error)}); using the IP bucket`);
      }
      if (isUserId(user)) {
        const value = String(user);
        return { kind: 'user', value, id: routeIdentity({ user: value }, this.hash) };
      }
      this.warnings.noUser(context, request, plan, policy, user);
      return ipWho(hooks.getIp(request));
    }
    if (keyBy === 'apiKey') return this.apiKeyIdentity(request, hooks);
    return this.functionIdentity(context, request, keyBy, hooks);
  }

  /** An identity on `allowList.users` or `allowList.apiKeys`: the policy skips it. */
  allowListed(who: Who): boolean {
    const { users, apiKeys } = this.options.allowList;
    return (who.kind === 'user' && users.has(who.value)) || (who.kind === 'apiKey' && apiKeys.has(who.value));
  }

  private async apiKeyIdentity(request: any, hooks: RequestHooks): Promise<Who> {
    let key: unknown;
    try {
      key = await this.hooks.bounded(hooks.getApiKey(request));
    } catch (error) {
      this.logger.warn(`keys.apiKey ${failure(error)}; using the IP bucket`);
    }
    return typeof key === 'string' && key !== ''
      ? { kind: 'apiKey', value: key, id: routeIdentity({ apiKey: key }, this.hash) }
      : ipWho(hooks.getIp(request));
  }

  private async functionIdentity(
    context: ExecutionContext,
    request: any,
    keyBy: (context: ExecutionContext) => string | Promise<string>,
    hooks: RequestHooks,
  ): Promise<Who> {
    const name = keyBy.name || '(anonymous)';
    try {
      const value: unknown = await this.hooks.bounded(keyBy(context));
      if (typeof value === 'string' && value !== '') return { kind: 'custom', value, id: routeIdentity({ id: value }, this.hash) };
      this.logger.warn(`keyBy function ${name} returned ${value === '' ? 'an empty string' : typeof value}; using the IP bucket`);
    } catch (error) {
      this.logger.warn(`keyBy function ${name} ${failure(error)}; using the IP bucket`);
    }
    return ipWho(hooks.getIp(request));
  }
}

function ipWho(address: string | undefined): Who {
  // routeIdentity({ ip }) is ipIdentity: called directly on the hot path, without the object.
  const id = ipIdentity(address);
  return { kind: 'ip', value: id.slice(3), id };
}
