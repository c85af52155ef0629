import { Inject, Injectable, Optional, ServiceUnavailableException } from '@nestjs/common';
import { performance } from 'node:perf_hooks';
import { RateLimitEvents } from '../events/rate-limit-events.js';
import type { BucketDecision, BucketPolicy } from '../rate-limit.interfaces.js';
import { PROBE_AFTER_FAILURES } from '../rate-limit.constants.js';
import { RATE_LIMIT_OPTIONS } from '../rate-limit.module-definition.js';
import type { FailureMode, ResolvedRateLimitOptions } from '../rate-limit.options.js';
import {
  assertRouteIdentity,
  createDigest,
  type Digest,
  type RouteIdentity,
  type RouteIdentityKind,
  routeIdentity,
  routeIdentityKind,
  routeKey,
  serviceKey,
} from '../keys/identity.js';
import { ThrottledLogger } from '../throttled-logger.js';
import { assertCost, assertServicePolicy, type CompiledPolicy } from '../policies/policy.js';
import { PolicyRegistry } from '../policies/policy-registry.js';
import { BucketStore, type TakeOptions, type TakeResult } from '../stores/bucket-store.interface.js';
import { localStoreOptions, MemoryBucketStore } from '../stores/memory-bucket.store.js';
import { DenyCache } from './deny-cache.js';
import { type BucketRequest, mergeRepeatedKeys, toDecision } from './token-bucket.js';
import { Deadlines, withTimeout } from './with-timeout.js';
import { keysOf, unknownKeyOf } from '../unknown-keys.js';

/** How a verdict was reached. */
export type VerdictSource =
  /** The configured store answered. */
  | 'store'
  /** Denied in process: the store denied this bucket recently and it cannot have refilled yet (`denyCache`). */
  | 'cache'
  /** The store failed; an in-process bucket decided (`failureMode: 'local'`). */
  | 'local'
  /** The store failed; allowed without a decision (`failureMode: 'open'`). */
  | 'open'
  /** The store failed; refused without a decision (`failureMode: 'closed'`). */
  | 'closed';

/** One atomic decision over the buckets of a request. */
export interface Verdict {
  allowed: boolean;
  /** One decision per bucket, in request order. */
  decisions: BucketDecision[];
  source: VerdictSource;
}

/** One bucket in a `consumeAll()` call. */
export interface BucketEntry {
  name: string;
  policy: BucketPolicy;
  /** Tokens to take; default 1. */
  cost?: number;
}

const ENTRY_KEYS = keysOf<keyof BucketEntry>({ name: true, policy: true, cost: true });

/** What a request gets while the store fails, per `failureMode`, for the log. */
const FAILURE_EFFECT: Record<FailureMode, string> = {
  open: 'requests are allowed without a limit',
  closed: 'requests are refused (503)',
  local: 'requests are limited by in-process buckets',
};

/**
 * The store could not decide and `failureMode` is `'closed'`. A `ServiceUnavailableException`, so a
 * Nest application that lets it propagate answers 503 with the same body the guard sends
 * (`{ statusCode: 503, message: 'Rate limiting is unavailable; try again shortly', error: 'Service Unavailable' }`);
 * `cause` says why.
 */
export class RateLimitUnavailableError extends ServiceUnavailableException {
  constructor(cause: unknown) {
    super('Rate limiting is unavailable; try again shortly', {
      description: 'Service Unavailable',
      cause: typeof cause === 'string' ? new Error(`rate-limit store unavailable: ${cause}`) : cause,
    });
    this.name = 'RateLimitUnavailableError';
  }
}

/**
 * Token buckets by name, shared by every instance through the store. Also the decision path of the
 * guard: the timeout and the failure mode live here, once.
 */
@Injectable()
export class BucketService {
  private readonly logger = new ThrottledLogger('RateLimit');
  /** The buckets of `failureMode: 'local'`, emptied when the store answers again. */
  private readonly local: MemoryBucketStore;
  /**
   * One breaker per Redis node ('' for a single server, or a Cluster node whose slots are not known yet),
   * present only while that node's last calls failed: a hung shard trips its own, the others keep deciding.
   */
  private readonly breakers = new Map<string, Breaker>();
  /** Decisions `failureMode` made in the current outage, for the recovery log line. */
  private degraded = 0;
  /** Denials this instance can repeat without asking the store; undefined when off or the store is local. */
  private readonly denyCache: DenyCache | undefined;
  /** The timeout of every decision, one timer for all of them. */
  private readonly deadlines: Deadlines;
  /** Digest of bucket names that cannot appear in a key as they are. */
  private readonly hash: Digest;
  /**
   * The route policies, for `peekRoute()` / `resetRoute()`. Injected as a property, so that a service
   * built by hand (`new BucketService(store, options)`) still works: then it has no routes.
   */
  @Optional()
  @Inject(PolicyRegistry)
  private readonly registry: PolicyRegistry | undefined;

  constructor(
    @Inject(BucketStore) private readonly store: BucketStore,
    @Inject(RATE_LIMIT_OPTIONS) private readonly options: ResolvedRateLimitOptions,
    @Optional() private readonly events: RateLimitEvents = new RateLimitEvents(),
  ) {
    // A reset is remembered longer than any answer can be on its way (they come within timeoutMs, or are dropped).
    this.denyCache =
      options.denyCache && store.remote ? new DenyCache(undefined, undefined, Math.max(60_000, 2 * options.timeoutMs)) : undefined;
    this.local = new MemoryBucketStore(localStoreOptions(options, "failureMode: 'local'"));
    this.deadlines = new Deadlines(options.timeoutMs);
    this.hash = createDigest(options.secret);
  }

  /**
   * Takes `cost` tokens from the bucket `name` if it has them. With `failureMode: 'closed'` a store
   * failure throws `RateLimitUnavailableError`; with `'open'` the decision is allowed as if the bucket were full.
   */
  async consume(name: string, policy: BucketPolicy, cost = 1): Promise<BucketDecision> {
    // consumeAll() of one entry, without its arrays and its extra await: this is the hot path of callers.
    const verdict = await this.decide([this.request({ name, policy }, cost)]);
    if (verdict.source === 'closed') throw new RateLimitUnavailableError('failureMode is closed');
    return verdict.decisions[0];
  }

  /**
   * Takes from several buckets atomically: all of them have the tokens and are drained, or none is touched.
   * Answers `{ allowed, decisions }`: `decisions[i]` is the decision of `entries[i]`, each with the request's
   * `allowed`; when denied, `retryAfterSeconds` is at least 1 for the buckets that lacked tokens and 0 for
   * those that had them, so the wait of the whole request is the largest one.
   */
  async consumeAll(entries: readonly BucketEntry[]): Promise<{ allowed: boolean; decisions: BucketDecision[] }> {
    const requests = entries.map((entry) => this.request(entry, entry.cost ?? 1));
    assertRepeatsFit(entries, requests);
    const verdict = await this.decide(requests);
    if (verdict.source === 'closed') throw new RateLimitUnavailableError('failureMode is closed');
    return { allowed: verdict.allowed, decisions: verdict.decisions };
  }

  /** What `consume(name, policy)` would decide now, without taking a token. */
  async peek(name: string, policy: BucketPolicy): Promise<BucketDecision> {
    const verdict = await this.decide([this.request({ name, policy }, 1)], true);
    if (verdict.source === 'closed') throw new RateLimitUnavailableError('failureMode is closed');
    return verdict.decisions[0];
  }

  /**
   * Gives `cost` tokens back to the bucket `name` (capped at its capacity), for work that turned out not
   * to count — the refund of an earlier `consume()`. Answers the bucket's decision after the refund
   * (`allowed` true). With `failureMode: 'closed'` a store failure throws `RateLimitUnavailableError`;
   * with `'open'` nothing is given back and the bucket is reported as full.
   */
  async refund(name: string, policy: BucketPolicy, cost = 1): Promise<BucketDecision> {
    const request = this.request({ name, policy }, cost);
    const tokens = await this.giveBack([request], 'store');
    if (tokens === undefined) {
      if (this.options.failureMode === 'closed') throw new RateLimitUnavailableError('failureMode is closed');
      return toDecision(request, request.capacity, 0, true);
    }
    return toDecision(request, tokens[0], 0, true);
  }

  /** True while the store keeps failing (the breaker is open): one decision at a time probes it, the others follow `failureMode`. */
  get storeFailing(): boolean {
    for (const breaker of this.breakers.values()) if (breaker.failures >= PROBE_AFTER_FAILURES) return true;
    return false;
  }

  /**
   * Makes the bucket `name` full again. Rejects with `RateLimitUnavailableError` when the store fails or
   * does not answer within `timeoutMs`, whatever `failureMode`: the bucket was not reset.
   */
  async reset(name: string): Promise<void> {
    await this.deleteBucket(serviceKey(this.options.keyPrefix, name, this.hash));
  }

  /**
   * What the next request of the route policy `scope` would get from the bucket of `who`, without taking
   * a token: `scope` is the policy's `name`, or `Controller.handler` for an unnamed one (`#i` appended
   * for the i-th of stacked unnamed policies). `who` is `{ ip }`, `{ user }`, `{ apiKey }` or `{ id }`
   * (what a keyBy function returned); the key is the one the route limiter drains for that identity.
   *
   * The numbers are the policy's; pass `policy` when they are computed per request, or when routes
   * that share the name have different ones. The decision is for a request of `policy.cost`, else of
   * the policy's cost (1 when its routes' costs differ). Fails like `peek()`.
   */
  async peekRoute(scope: string, who: RouteIdentity, policy?: BucketPolicy & { cost?: number }): Promise<BucketDecision> {
    const where = `BucketService.peekRoute(${JSON.stringify(scope)})`;
    const policies = this.routePolicies(scope, who, where);
    const numbers = policy ?? sharedNumbers(policies, scope, where);
    assertServicePolicy(numbers, where, ['cost']);
    const cost = policy?.cost ?? sharedCost(policies);
    assertCost(cost, numbers.capacity, where, 'BucketService');
    const request: BucketRequest = {
      key: routeKey(this.options.keyPrefix, routeIdentity(who, this.hash), policies[0].keySuffix),
      capacity: numbers.capacity,
      refillPerSecond: numbers.refillPerSecond,
      cost,
    };
    // A bucket under a penalty holds tokens below 0: the store reads them as such only when told the penalty.
    const blockSeconds = Math.max(...policies.map((p) => p.blockSeconds));
    if (blockSeconds > 0) request.blockSeconds = blockSeconds;
    const verdict = await this.decide([request], true);
    if (verdict.source === 'closed') throw new RateLimitUnavailableError('failureMode is closed');
    return verdict.decisions[0];
  }

  /**
   * Makes the bucket of `who` for the route policy `scope` full again (after a captcha, say): the
   * store's key, this instance's deny-cache entry and its `failureMode: 'local'` bucket. `scope` and
   * `who` as in `peekRoute()`. Fails like `reset()`.
   */
  async resetRoute(scope: string, who: RouteIdentity): Promise<void> {
    const policies = this.routePolicies(scope, who, `BucketService.resetRoute(${JSON.stringify(scope)})`);
    await this.deleteBucket(routeKey(this.options.keyPrefix, routeIdentity(who, this.hash), policies[0].keySuffix));
  }

  /**
   * The compiled route policies of `scope`, after checking `who` and that one of them can key a bucket
   * by its kind (every policy falls back to the IP, so `{ ip }` always can).
   */
  private routePolicies(scope: string, who: RouteIdentity, where: string): CompiledPolicy[] {
    assertRouteIdentity(who, where);
    if (this.registry === undefined) {
      throw new Error(`${where}: this BucketService knows no routes (it was not created by RateLimitModule)`);
    }
    const byScope = new Map<string, CompiledPolicy[]>();
    for (const { plan } of this.registry.routes()) {
      for (const policy of plan?.policies ?? []) byScope.set(policy.scope, [...(byScope.get(policy.scope) ?? []), policy]);
    }
    const policies = typeof scope === 'string' ? byScope.get(scope) : undefined;
    if (policies === undefined) {
      const known = [...byScope.keys()].sort().map((s) => JSON.stringify(s));
      throw new Error(
        `${where}: no route policy has the scope ${typeof scope === 'string' ? JSON.stringify(scope) : String(scope)} ` +
          `(a policy's name, or Controller.handler for an unnamed one); ` +
          (known.length === 0 ? 'no route has a @RateLimit policy' : `known scopes: ${known.join(', ')}`),
      );
    }
    const kind = routeIdentityKind(who);
    const kinds = new Set<RouteIdentityKind>(['ip', ...policies.map(identityKindOf)]);
    if (!kinds.has(kind)) {
      throw new Error(
        `${where}: the policies of scope ${JSON.stringify(scope)} key buckets by ${[...kinds].join(' or ')}, ` +
          `never by ${kind}: that bucket does not exist`,
      );
    }
    return policies;
  }

  /**
   * Deletes one bucket: this instance's deny-cache entry and local bucket, then the store's key. Rejects
   * with `RateLimitUnavailableError` (its cause the store's error) when the store fails or times out.
   *
   * The reset wins over answers still on their way: the deny cache forgets the bucket at once, and again
   * when the store has deleted it, so that no answer to a request sent before then (which Redis may have
   * decided before the delete) is learned afterwards.
   */
  private async deleteBucket(key: string): Promise<void> {
    const keys = [key];
    this.denyCache?.forget(key);
    await this.local.delete(keys);
    try {
      const deleted = this.store.delete(keys);
      await (this.store.remote ? withTimeout(deleted, this.options.timeoutMs) : deleted);
    } catch (error) {
      throw new RateLimitUnavailableError(error);
    }
    this.denyCache?.forget(key);
  }

  /**
   * One atomic decision over `requests`, never waiting longer than `timeoutMs` for a remote store.
   * A request the store would deny for sure (`denyCache`) is denied without asking it. When the store fails, `failureMode` decides. Once it has failed several times in a row, one
   * decision at a time asks it (the probe) and the others follow `failureMode` at once: a hung Redis
   * costs one request per `timeoutMs` a wait instead of every request, and no pile of stale commands
   * builds up for it. A single slow reply does not trip this. The first call that succeeds ends the
   * outage; no timer, no restart.
   */
  async decide(requests: readonly BucketRequest[], dryRun = false): Promise<Verdict> {
    // A key named twice (consumeAll, or stacked policies that meet on one identity at run time) is one
    // bucket: decided once for the summed cost, and its decision reported for each request.
    const merged = mergeRepeatedKeys(requests);
    if (merged === undefined) return this.decideDistinct(requests, dryRun);
    const verdict = await this.decideDistinct(merged.requests, dryRun);
    return { ...verdict, decisions: merged.positions.map((j) => ({ ...verdict.decisions[j] })) };
  }

  private async decideDistinct(requests: readonly BucketRequest[], dryRun: boolean): Promise<Verdict> {
    const cache = dryRun ? undefined : this.denyCache;
    const sentAt = cache === undefined ? 0 : cache.now();
    const denied = cache?.deny(requests, sentAt);
    if (denied !== undefined) return toVerdict(requests, { allowed: false, tokens: denied }, 'cache');
    const options: TakeOptions | undefined = dryRun ? { dryRun } : undefined;
    // Healthy, nothing to look up; else the breakers of this decision's nodes: one open and probed already
    // sends it to failureMode, one open and not probed makes it the probe.
    let probes: Breaker[] | undefined;
    if (this.breakers.size > 0) {
      for (const node of this.nodesOf(requests)) {
        const breaker = this.breakers.get(node);
        if (breaker === undefined || breaker.failures < PROBE_AFTER_FAILURES) continue;
        if (breaker.probing) {
          probes?.forEach((probe) => (probe.probing = false));
          return this.fallback(requests, options);
        }
        breaker.probing = true;
        (probes ??= []).push(breaker);
      }
    }
    const timed = this.events.storeWatched;
    // The store's latency, like its deadline, runs from the write: a decision that waited for the turn's
    // shared call did not wait for Redis meanwhile (a call refused before any write counts from here).
    let started = timed ? performance.now() : 0;
    try {
      const result = this.store.remote
        ? await this.deadlines.raceSent((sent) =>
            this.store.take(requests, {
              dryRun,
              sent: timed
                ? () => {
                    started = performance.now();
                    sent();
                  }
                : sent,
            }),
          )
        : await this.store.take(requests, options);
      if (timed) this.events.storeCall({ durationMs: performance.now() - started, outcome: 'ok' });
      if (this.breakers.size > 0) this.recovered(requests);
      cache?.learn(requests, result, sentAt);
      return toVerdict(requests, result, 'store');
    } catch (error) {
      if (timed) this.events.storeCall({ durationMs: performance.now() - started, outcome: 'error' });
      this.failed(error, requests);
      return this.fallback(requests, options);
    } finally {
      probes?.forEach((probe) => (probe.probing = false));
    }
  }

  /**
   * Gives back what an allowed decision of `source` took, capped at capacity: the store's buckets, or the
   * in-process ones of `failureMode: 'local'`; nothing was taken in `'open'` mode. Answers the tokens
   * after the refund, or undefined when there was nothing to give back or the store failed (then the
   * tokens come back by refilling). Never waits longer than `timeoutMs`.
   */
  async giveBack(requests: readonly BucketRequest[], source: VerdictSource): Promise<number[] | undefined> {
    const merged = mergeRepeatedKeys(requests);
    if (merged === undefined) return this.refundDistinct(requests, source);
    const tokens = await this.refundDistinct(merged.requests, source);
    return tokens === undefined ? undefined : merged.positions.map((j) => tokens[j]);
  }

  private async refundDistinct(requests: readonly BucketRequest[], source: VerdictSource): Promise<number[] | undefined> {
    if (source === 'local') return this.local.takeSync(requests, { refund: true }).tokens;
    if (source !== 'store') return undefined;
    // Forgotten before and after: a denial learned from a request the store decided before the refund is stale.
    for (const request of requests) this.denyCache?.forget(request.key);
    try {
      const { tokens } = await (this.store.remote
        ? this.deadlines.raceSent((sent) => this.store.take(requests, { refund: true, sent }))
        : this.store.take(requests, { refund: true }));
      for (const request of requests) this.denyCache?.forget(request.key);
      return tokens;
    } catch (error) {
      this.failed(error, requests);
      return undefined;
    }
  }

  /** The verdict `failureMode` gives while the store cannot decide. */
  private fallback(requests: readonly BucketRequest[], options: TakeOptions | undefined): Verdict {
    this.degraded++;
    const source = this.options.failureMode;
    if (source === 'local') return toVerdict(requests, this.local.takeSync(requests, options), 'local');
    const allowed = source === 'open';
    return {
      allowed,
      source,
      decisions: requests.map((r) => toDecision(r, allowed ? r.capacity - r.cost : 0, r.cost, allowed)),
    };
  }

  private request(entry: BucketEntry, cost: number): BucketRequest {
    const where = `BucketService bucket "${entry.name}"`;
    const unknown = unknownKeyOf(entry, ENTRY_KEYS, 'the entry');
    if (unknown !== undefined) throw new Error(`BucketService ${unknown} on ${where}`);
    assertServicePolicy(entry.policy, where);
    assertCost(cost, entry.policy.capacity, where, 'BucketService');
    return {
      key: serviceKey(this.options.keyPrefix, entry.name, this.hash),
      capacity: entry.policy.capacity,
      refillPerSecond: entry.policy.refillPerSecond,
      cost,
    };
  }

  /** The Redis nodes that hold `requests`' buckets: one for a single server (''), one per slot owner on a Cluster. */
  private nodesOf(requests: readonly BucketRequest[]): readonly string[] {
    const nodeOf = this.store.nodeOf;
    if (nodeOf === undefined) return SINGLE_NODE;
    if (requests.length === 1) return [nodeOf.call(this.store, requests[0].key) ?? ''];
    return [...new Set(requests.map((request) => nodeOf.call(this.store, request.key) ?? ''))];
  }

  /** A failed call counts against the breaker of every node it asked: it cannot tell which one failed. */
  private failed(error: unknown, requests: readonly BucketRequest[]): void {
    const nodes = this.nodesOf(requests);
    for (const node of nodes) {
      const breaker = this.breakers.get(node);
      if (breaker === undefined) this.breakers.set(node, { failures: 1, probing: false });
      else breaker.failures++;
    }
    this.logger.warn(
      `Rate-limit store failed${describeNodes(nodes)}: ${error instanceof Error ? error.message : String(error)}; ` +
        `${FAILURE_EFFECT[this.options.failureMode]} until it answers again (failureMode '${this.options.failureMode}')`,
    );
  }

  /** The nodes of a call that succeeded answer again: their breakers close. */
  private recovered(requests: readonly BucketRequest[]): void {
    // On a Cluster, failures counted before its slots were known ('') are over too.
    const asked = this.store.nodeOf === undefined ? this.nodesOf(requests) : [...this.nodesOf(requests), ''];
    const nodes = asked.filter((node) => this.breakers.delete(node));
    if (nodes.length === 0) return;
    if (this.breakers.size > 0) {
      this.logger.log(`Rate-limit store answers again${describeNodes(nodes)}; other nodes still fail`);
      return;
    }
    // Redis' buckets are the truth again; the outage's in-process ones would be stale at the next outage.
    this.local.clear();
    const degraded = this.degraded;
    this.degraded = 0;
    this.logger.log(
      `Rate-limit store answers again${describeNodes(nodes)}; ${degraded} decision(s) followed failureMode '${this.options.failureMode}' meanwhile`,
    );
  }
}

/** The breaker of one Redis node: calls that failed in a row, and whether a probe is on its way. */
interface Breaker {
  failures: number;
  probing: boolean;
}

const SINGLE_NODE: readonly string[] = [''];

/** ' (Redis node host:port, …)' for Cluster nodes; nothing for a single server. */
function describeNodes(nodes: readonly string[]): string {
  const named = nodes.filter((node) => node !== '');
  return named.length === 0 ? '' : ` (Redis node ${named.join(', ')})`;
}

/** The identity kind a policy's own keyBy gives (its fallback, the IP, aside). */
function identityKindOf(policy: CompiledPolicy): RouteIdentityKind {
  return typeof policy.keyBy === 'function' ? 'id' : policy.keyBy;
}

/** The numbers every policy of a scope has, or an error asking for them. */
function sharedNumbers(policies: readonly CompiledPolicy[], scope: string, where: string): BucketPolicy {
  const ask = `pass them: peekRoute(${JSON.stringify(scope)}, who, { capacity, refillPerSecond })`;
  if (policies.some((p) => p.dynamic !== undefined)) {
    throw new Error(`${where}: the numbers of this policy are computed per request (functions or resolve); ${ask}`);
  }
  const [first] = policies;
  const differ = policies.some((p) => p.capacity !== first.capacity || p.refillPerSecond !== first.refillPerSecond);
  if (differ) {
    const seen = [...new Set(policies.map((p) => `capacity ${p.capacity}, refillPerSecond ${p.refillPerSecond}`))];
    throw new Error(`${where}: the routes that share this policy name have different numbers (${seen.join('; ')}); ${ask}`);
  }
  return { capacity: first.capacity, refillPerSecond: first.refillPerSecond };
}

/** The cost of a request of a scope's policies, or 1 when they differ or one is computed per request. */
function sharedCost(policies: readonly CompiledPolicy[]): number {
  if (policies.some((p) => p.dynamic !== undefined)) return 1;
  return policies.every((p) => p.cost === policies[0].cost) ? policies[0].cost : 1;
}

function toVerdict(requests: readonly BucketRequest[], result: TakeResult, source: VerdictSource): Verdict {
  const { allowed, tokens } = result;
  return { allowed, source, decisions: requests.map((r, i) => toDecision(r, tokens[i], r.cost, allowed)) };
}

/**
 * A `consumeAll()` that names one bucket twice is merged (`decide`): that needs one policy, and a
 * summed cost the bucket can hold at all, else the call could never be allowed. A caller's mistake,
 * refused like a cost above the capacity in `consume()`.
 */
function assertRepeatsFit(entries: readonly BucketEntry[], requests: readonly BucketRequest[]): void {
  if (requests.length < 2) return;
  const first = new Map<string, number>();
  const costs = new Map<string, number>();
  requests.forEach((request, i) => {
    const j = first.get(request.key);
    if (j === undefined) {
      first.set(request.key, i);
      costs.set(request.key, request.cost);
      return;
    }
    const name = entries[i].name;
    if (requests[j].capacity !== request.capacity || requests[j].refillPerSecond !== request.refillPerSecond) {
      throw new Error(
        `BucketService bucket "${name}" appears twice with different policies in one consumeAll() call: give it one policy`,
      );
    }
    const cost = (costs.get(request.key) as number) + request.cost;
    costs.set(request.key, cost);
    if (cost > request.capacity) {
      throw new Error(
        `BucketService costs of bucket "${name}" add up to ${cost}, more than its capacity ${request.capacity}, in one consumeAll() call`,
      );
    }
  });
}
