import { Inject, Injectable } from '@nestjs/common';
import { BucketService } from '../bucket/bucket.service.js';
import { RateLimitConfigError, RateLimitInputError } from '../errors/rate-limit.errors.js';
import { createDigest, type Digest, routeKey } from '../keys/identity-keys.js';
import type { CompiledPolicy } from '../policies/policy.js';
import { PolicyRegistry } from '../policies/policy-registry.js';
import { RATE_LIMIT_OPTIONS } from '../rate-limit.module-definition.js';
import type { ResolvedRateLimitOptions } from '../rate-limit.options.js';
import type { AnalyticsBackend } from './analytics/analytics-backend.js';
import type { ControlStore } from './control/control-store.js';
import { overrideField } from './control/control-store.js';
import {
  blockTarget,
  keyedIdentity,
  MAX_BLOCK_SECONDS,
  MAX_OPERATOR,
  MAX_REASON,
  onlyKeys,
  seconds,
  text,
} from './control/operator-input.js';
import { LiveOperations, type OperationsStatus } from './live-operations.js';
import type {
  AuditEntry,
  BlockEntry,
  BlockInput,
  IdentityInspection,
  KeyedIdentity,
  OverrideEntry,
  OverrideInput,
  PolicyView,
  SeriesPoint,
  TopIdentity,
} from './operations.types.js';

/** Who made a change and why, for the audit trail. */
export interface OperatorChange {
  by: string;
  reason?: string;
}

const OVERRIDE_KEYS = ['scope', 'identity', 'capacity', 'refillPerSecond', 'enforce', 'ttlSeconds', 'reason', 'by'] as const;
const BLOCK_KEYS = ['target', 'seconds', 'reason', 'by'] as const;
const CHANGE_KEYS = ['by', 'reason'] as const;
const MAX_CAPACITY = 1e9;

/**
 * The operator's API: who is limited (analytics), one identity's bucket now, and changes that every
 * instance applies within `operations.syncMs` plus a call (overrides of a policy's numbers or mode,
 * blocks of identities and address ranges, bucket resets), each written to the audit trail with who
 * and why. Input is checked as strictly as `forRoot`: a `RateLimitInputError` names the field and
 * nothing changes. With `operations` off, every method throws `ERR_RATE_LIMIT_OPERATIONS_OFF`.
 *
 * Identities are as the limiter keys them (`ip:…`, `user:…`, `key:<digest>`, `id:…`); a method that
 * takes one also takes `{ ip }`, `{ user }`, `{ apiKey }` or `{ id }`, keyed the same way (an API key
 * is digested and never kept).
 */
@Injectable()
export class RateLimitInsights {
  private readonly hash: Digest;

  constructor(
    private readonly live: LiveOperations,
    private readonly registry: PolicyRegistry,
    private readonly buckets: BucketService,
    @Inject(RATE_LIMIT_OPTIONS) private readonly options: ResolvedRateLimitOptions,
  ) {
    this.hash = createDigest(options.secret);
  }

  get enabled(): boolean {
    return this.live.enabled;
  }

  status(): OperationsStatus {
    return this.live.status();
  }

  /** The named policies, with the code's numbers and the override of every identity in force. */
  policies(): Promise<PolicyView[]> {
    this.store();
    const now = Date.now();
    const views = new Map<string, PolicyView>();
    for (const { plan } of this.registry.routes()) {
      for (const policy of plan?.policies ?? []) {
        let view = views.get(policy.scope);
        if (view === undefined) {
          view = {
            scope: policy.scope,
            enforce: policy.enforce,
            keyBy: typeof policy.keyBy === 'function' ? 'function' : policy.keyBy,
            routes: [],
            identityOverrides: 0,
          };
          if (policy.dynamic === undefined || policy.dynamic.fallback !== undefined) {
            view.capacity = policy.capacity;
            view.refillPerSecond = policy.refillPerSecond;
          }
          const all = this.live.control.overridesInForce.find((o) => o.scope === policy.scope && o.identity === undefined);
          if (all !== undefined && (all.until === undefined || all.until > now)) view.override = all;
          view.identityOverrides = this.live.control.overridesInForce.filter(
            (o) => o.scope === policy.scope && o.identity !== undefined,
          ).length;
          views.set(policy.scope, view);
        }
        if (!view.routes.includes(plan!.route)) view.routes.push(plan!.route);
      }
    }
    return Promise.resolve([...views.values()].sort((a, b) => a.scope.localeCompare(b.scope)));
  }

  /** The identities of a policy with the most refused (or allowed) decisions over the last `windowSeconds`. */
  top(scope: string, options: { by?: 'refused' | 'allowed'; windowSeconds?: number; limit?: number } = {}): Promise<TopIdentity[]> {
    const reader = this.reader();
    this.policiesOf(scope);
    const by = options.by ?? 'refused';
    if (by !== 'refused' && by !== 'allowed')
      throw new RateLimitInputError(`by must be 'refused' or 'allowed' (got ${JSON.stringify(by)})`);
    const window = seconds(options.windowSeconds ?? 300, 'windowSeconds', 60, 86_400)!;
    const limit = seconds(options.limit ?? 20, 'limit', 1, 100)!;
    return reader.top(scope, { by, windowSeconds: window, limit }, Date.now());
  }

  /** Allowed and refused decisions of a policy per second, oldest first, over the last `seconds` (default 900). */
  series(scope: string, options: { seconds?: number } = {}): Promise<SeriesPoint[]> {
    const reader = this.reader();
    this.policiesOf(scope);
    return reader.series(scope, seconds(options.seconds ?? 900, 'seconds', 60, 3600)!, Date.now());
  }

  /** One identity's bucket of one policy now (no token taken), the numbers it is decided with, and the override and block in force. */
  async inspect(scope: string, identity: KeyedIdentity | object): Promise<IdentityInspection> {
    this.store();
    const policy = this.policiesOf(scope)[0];
    const id = keyedIdentity(identity, 'identity', this.hash);
    const now = Date.now();
    const override = this.live.control.overrideOf(scope, id, now);
    const capacity = override?.capacity ?? (policy.capacity > 0 ? policy.capacity : undefined);
    const refillPerSecond = override?.refillPerSecond ?? (policy.refillPerSecond > 0 ? policy.refillPerSecond : undefined);
    if (capacity === undefined || refillPerSecond === undefined) {
      throw new RateLimitInputError(
        `scope ${JSON.stringify(scope)} computes its numbers per request and has no fallback: set an override to inspect it`,
      );
    }
    const request = {
      key: routeKey(this.options.keyPrefix, id, policy.keySuffix),
      capacity,
      refillPerSecond,
      cost: 1,
      blockSeconds: policy.blockSeconds || undefined,
    };
    const verdict = await this.buckets.decide([request], true);
    const decision = verdict.decisions[0];
    const result: IdentityInspection = {
      scope,
      identity: id,
      capacity,
      refillPerSecond,
      enforce: override?.enforce ?? policy.enforce,
      tokens: decision.remaining,
      secondsToFull: decision.resetSeconds,
      retryAfterSeconds: decision.retryAfterSeconds,
    };
    if (override !== undefined) result.override = override;
    const block = this.live.control.blockOf(id, now);
    if (block !== undefined) result.block = block;
    return result;
  }

  /** Makes an identity's bucket of a policy full again (penalty included), on every instance's next request. */
  async reset(scope: string, identity: KeyedIdentity | object, change: OperatorChange): Promise<void> {
    const store = this.store();
    const policy = this.policiesOf(scope)[0];
    const id = keyedIdentity(identity, 'identity', this.hash);
    const { by, reason } = this.change(change);
    await this.buckets.deleteRouteKey(routeKey(this.options.keyPrefix, id, policy.keySuffix));
    await store.note({ at: Date.now(), by, action: 'reset', scope, target: id, ...(reason ? { reason } : {}) });
  }

  /** Refuses an identity or an address range on every instance, before any bucket, until `seconds` have passed. */
  async block(input: BlockInput): Promise<BlockEntry> {
    const store = this.store();
    const fields = onlyKeys(input, BLOCK_KEYS, 'block');
    const target = blockTarget(fields.target, 'target', this.hash);
    const duration = seconds(fields.seconds, 'seconds', 1, MAX_BLOCK_SECONDS)!;
    const reason = text(fields.reason, 'reason', MAX_REASON)!;
    const by = text(fields.by, 'by', MAX_OPERATOR)!;
    const at = Date.now();
    const entry: BlockEntry = { target, reason, by, at, until: at + duration * 1000 };
    await store.writeBlock(target, entry, { at, by, action: 'block', target, reason, detail: { until: entry.until } });
    await this.live.sync();
    return entry;
  }

  /** Ends a block; false when none was in force. */
  async unblock(target: string, change: OperatorChange): Promise<boolean> {
    const store = this.store();
    const normalised = blockTarget(target, 'target', this.hash);
    const { by, reason } = this.change(change);
    const removed = await store.writeBlock(normalised, undefined, {
      at: Date.now(),
      by,
      action: 'unblock',
      target: normalised,
      ...(reason ? { reason } : {}),
    });
    await this.live.sync();
    return removed;
  }

  async blocks(): Promise<BlockEntry[]> {
    const snapshot = await this.store().load();
    const now = Date.now();
    return snapshot.blocks.filter((b) => b.until > now).sort((a, b) => b.at - a.at);
  }

  /**
   * Changes a named policy's numbers or mode, for every identity or for one (a customer's raised quota),
   * without a restart; the code's numbers come back when it is cleared or ends. Tokens already taken stay taken.
   */
  async setOverride(input: OverrideInput): Promise<OverrideEntry> {
    const store = this.store();
    const fields = onlyKeys(input, OVERRIDE_KEYS, 'override');
    if (typeof fields.scope !== 'string') throw new RateLimitInputError('scope must be a policy name (a string)');
    const scope = fields.scope;
    const policies = this.policiesOf(scope);
    const identity = fields.identity === undefined ? undefined : keyedIdentity(fields.identity, 'identity', this.hash);
    const capacity = seconds(fields.capacity, 'capacity', 1, MAX_CAPACITY, false);
    const refill = fields.refillPerSecond;
    if (refill !== undefined && (typeof refill !== 'number' || !Number.isFinite(refill) || refill <= 0 || refill > MAX_CAPACITY)) {
      throw new RateLimitInputError(
        `refillPerSecond must be a finite number > 0 and at most ${MAX_CAPACITY} (got ${JSON.stringify(refill)})`,
      );
    }
    const enforce = fields.enforce;
    if (enforce !== undefined && typeof enforce !== 'boolean') throw new RateLimitInputError('enforce must be true or false');
    if (capacity === undefined && refill === undefined && enforce === undefined) {
      throw new RateLimitInputError('an override sets at least one of capacity, refillPerSecond, enforce');
    }
    const ttl = seconds(fields.ttlSeconds, 'ttlSeconds', 1, MAX_BLOCK_SECONDS, false);
    const reason = text(fields.reason, 'reason', MAX_REASON)!;
    const by = text(fields.by, 'by', MAX_OPERATOR)!;
    // A request's cost must fit in the bucket: a fixed cost larger than the new capacity could never pass.
    const largestCost = Math.max(...policies.filter((p) => p.dynamic === undefined).map((p) => p.cost), 1);
    if (capacity !== undefined && capacity < largestCost) {
      throw new RateLimitInputError(
        `capacity ${capacity} is below the cost ${largestCost} of a request of ${scope}: no request could pass`,
      );
    }
    const at = Date.now();
    const entry: OverrideEntry = { scope, reason, by, at };
    if (identity !== undefined) entry.identity = identity;
    if (capacity !== undefined) entry.capacity = capacity;
    if (refill !== undefined) entry.refillPerSecond = refill as number;
    if (typeof enforce === 'boolean') entry.enforce = enforce;
    if (ttl !== undefined) entry.until = at + ttl * 1000;
    const detail: Record<string, unknown> = {};
    for (const key of ['capacity', 'refillPerSecond', 'enforce', 'until'] as const) if (entry[key] !== undefined) detail[key] = entry[key];
    await store.writeOverride(overrideField(scope, identity), entry, {
      at,
      by,
      action: 'override',
      scope,
      target: identity,
      reason,
      detail,
    });
    await this.live.sync();
    return entry;
  }

  /** Clears an override: the code's numbers again. False when none was in force. */
  async clearOverride(scope: string, identity: KeyedIdentity | object | undefined, change: OperatorChange): Promise<boolean> {
    const store = this.store();
    this.policiesOf(scope);
    const id = identity === undefined ? undefined : keyedIdentity(identity, 'identity', this.hash);
    const { by, reason } = this.change(change);
    const audit: AuditEntry = {
      at: Date.now(),
      by,
      action: 'clear-override',
      scope,
      ...(id ? { target: id } : {}),
      ...(reason ? { reason } : {}),
    };
    const removed = await store.writeOverride(overrideField(scope, id), undefined, audit);
    await this.live.sync();
    return removed;
  }

  async overrides(): Promise<OverrideEntry[]> {
    const snapshot = await this.store().load();
    const now = Date.now();
    return snapshot.overrides.filter((o) => o.until === undefined || o.until > now).sort((a, b) => b.at - a.at);
  }

  /** The changes, newest first (the store keeps the last 1,000). */
  audit(limit = 100): Promise<AuditEntry[]> {
    return this.store().audit(seconds(limit, 'limit', 1, 1000)!);
  }

  private store(): ControlStore {
    if (this.live.store === undefined) {
      throw new RateLimitConfigError(
        'ERR_RATE_LIMIT_OPERATIONS_OFF',
        'RateLimitInsights: operations are off; RateLimitModule.forRoot({ operations: true }) turns them on',
      );
    }
    return this.live.store;
  }

  private reader(): AnalyticsBackend {
    this.store();
    if (this.live.analytics === undefined)
      throw new RateLimitInputError('analytics are off (operations.analytics: false): nothing was counted');
    return this.live.analytics;
  }

  private policiesOf(scope: unknown): CompiledPolicy[] {
    const found: CompiledPolicy[] = [];
    for (const { plan } of this.registry.routes()) for (const p of plan?.policies ?? []) if (p.scope === scope) found.push(p);
    if (found.length === 0) {
      const shown = typeof scope === 'string' ? JSON.stringify(scope.slice(0, 120)) : typeof scope;
      throw new RateLimitInputError(`scope ${shown} is not the name of a route policy`);
    }
    return found;
  }

  private change(change: unknown): { by: string; reason: string | undefined } {
    const fields = onlyKeys(change, CHANGE_KEYS, 'change');
    return { by: text(fields.by, 'by', MAX_OPERATOR)!, reason: text(fields.reason, 'reason', MAX_REASON, false) };
  }
}
