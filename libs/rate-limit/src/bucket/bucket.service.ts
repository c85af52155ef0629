import { Inject, Injectable, type OnModuleDestroy, type OnModuleInit, Optional } from '@nestjs/common';
import { ModulesContainer } from '@nestjs/core';
import { DecisionEngine, type EngineHealth } from '../engine/decision-engine.js';
import { RateLimitEvents } from '../events/rate-limit-events.js';
import { assertRouteIdentity, createDigest, type Digest, type RouteIdentity, serviceKey } from '../keys/identity-keys.js';
import { RateLimitUnavailableError } from '../errors/rate-limit.errors.js';
import type { BucketDecision, BucketPolicy, Verdict, VerdictSource } from '../rate-limit.interfaces.js';
import { RATE_LIMIT_OPTIONS } from '../rate-limit.module-definition.js';
import type { ResolvedRateLimitOptions } from '../rate-limit.options.js';
import { BucketStore } from '../stores/bucket-store.interface.js';
import { type BucketRequest, toDecision } from '../stores/token-bucket.js';
import { describeValue } from './bucket-policy.check.js';
import { type AcquireOptions, acquireCall } from './acquire-options.js';
import { bindPacedInstances, instancesOf, type PacedBinding, setRunningBucketService } from './active-bucket-service.js';
import { type AcquireDecision, WaitingRoom } from './waiting-room.js';
import { DEFAULT_ACQUIRE_MAX_WAITING } from '../rate-limit.constants.js';
import { RouteBuckets } from './route-buckets.js';
import { RateLimitConfigError } from '../errors/rate-limit.errors.js';
import { type ConcurrencySlot, ConcurrencySlots } from './concurrency-slots.js';
import {
  assertBucketName,
  assertRepeatsFit,
  type BucketEntry,
  type BucketMethod,
  type PrioritizedPolicy,
  serviceRequest,
  slotKey,
} from './service-requests.js';
import { type SlotOptions, slotTake } from './slot-options.js';
import { holdsSlots } from '../stores/slots.js';
import { RateLimitConcurrencyError } from '../errors/rate-limit.errors.js';

export type { BucketEntry, PrioritizedPolicy } from './service-requests.js';

/**
 * Token buckets by name, shared by every instance through the store. Also the decision path of the
 * guard: it decides through `decide()` and `giveBack()`, over the decision engine (timeout, breakers,
 * failure mode, deny cache), once per application.
 */
@Injectable()
export class BucketService implements OnModuleInit, OnModuleDestroy {
  private readonly engine: DecisionEngine;
  /** Concurrency slots: `takeSlot()`, `withSlot()` and `@ConcurrencyLimit` routes. */
  readonly slots: ConcurrencySlots;
  /** The calls of `acquire()` waiting for their turn. */
  private readonly room: WaitingRoom;
  /** Digest of bucket names that cannot appear in a key as they are. */
  private readonly hash: Digest;
  /**
   * The route policies' buckets, for `peekRoute()` / `resetRoute()`. Injected as a property, so that a
   * service built by hand (`new BucketService(store, options)`) still works: then it has no routes.
   */
  @Optional()
  @Inject(RouteBuckets)
  private readonly routes: RouteBuckets | undefined;
  /** The application's modules, whose instances with `@Paced` methods are bound to this service at init. */
  @Optional()
  @Inject(ModulesContainer)
  private readonly modules: ModulesContainer | undefined;
  /** What the `@Paced` instances of this application see: this service, while it is open. */
  private readonly paced: PacedBinding = { service: this, open: false };

  constructor(
    @Inject(BucketStore) private readonly store: BucketStore,
    @Inject(RATE_LIMIT_OPTIONS) private readonly options: ResolvedRateLimitOptions,
    @Optional() events: RateLimitEvents = new RateLimitEvents(),
  ) {
    this.engine = new DecisionEngine(store, options, events);
    this.hash = createDigest(options.secret);
    this.room = new WaitingRoom(this.engine, options.acquireMaxWaiting ?? DEFAULT_ACQUIRE_MAX_WAITING);
    this.slots = new ConcurrencySlots(this.engine, holdsSlots(store) ? store : undefined);
  }

  /**
   * `@Paced` methods of the instances this application created call this service from now on (every
   * instance exists once a module initialises); so do those of any other instance while this is the only
   * application running.
   */
  onModuleInit(): void {
    this.paced.open = true;
    if (this.modules !== undefined) bindPacedInstances(instancesOf(this.modules.values()), this.paced);
    setRunningBucketService(this, true);
  }

  /**
   * The application is closing: waiting `acquire()` calls are rejected and their reservations given back,
   * and the `@Paced` calls of its instances are refused from now on.
   */
  async onModuleDestroy(): Promise<void> {
    this.paced.open = false;
    setRunningBucketService(this, false);
    await Promise.all([this.room.close(), this.slots.close()]);
    // After the waits: what the leases did not spend goes back to Redis while the connection is open.
    await this.engine.close();
  }

  /**
   * Waits until `cost` tokens of the bucket `name` are the caller's, then resolves with `consume()`'s
   * decision (allowed) and how long it waited. At most one store call per acquire (the calls of one
   * event-loop turn share one): it reserves the tokens now (the bucket may go below 0 by them) and answers
   * when they exist; the call then waits on a timer. Callers
   * are served in the order their reservations reach Redis, across every instance, and never more than
   * the policy promises. It rejects, and holds nothing, when:
   * the wait would exceed `maxWaitMs` (`RateLimitWaitTooLongError`, at once, nothing reserved); `signal`
   * aborts before the turn (an `AbortError` whose `cause` is the signal's reason; the reservation is given
   * back, its tokens returning only while no caller reserved after it); the store fails under `failureMode: 'closed'` (`RateLimitUnavailableError`); more than
   * `acquire.maxWaiting` calls wait in this process, or the application closes
   * (`RateLimitError` `ERR_RATE_LIMIT_TOO_MANY_WAITING`, `ERR_RATE_LIMIT_SHUTTING_DOWN`).
   */
  acquire(name: string, policy: BucketPolicy, options: AcquireOptions = {}): Promise<AcquireDecision> {
    let request: BucketRequest;
    let call;
    try {
      assertBucketName(name, 'acquire');
      call = acquireCall(name, policy, options, this.options);
      request = this.request({ name, policy }, options.cost ?? 1, 'acquire');
    } catch (error) {
      return Promise.reject(error);
    }
    return this.room.acquire(request, call);
  }

  /**
   * A concurrency slot of `name`: held when fewer than `options.limit` are in flight under that name on
   * every instance (one store call), else refused (`held: false`) at once or after `maxWaitMs`. Give it
   * back with `release()`, or hold it with `await using`; while held it is renewed every third of its
   * lease. docs/guides/concurrency.md.
   */
  takeSlot(name: string, options: SlotOptions): Promise<ConcurrencySlot> {
    try {
      assertBucketName(name, 'takeSlot');
      return this.slots.take(
        slotTake(slotKey(serviceKey(this.options.keyPrefix, name, this.hash)), name, options, this.options, 'takeSlot'),
      );
    } catch (error) {
      return Promise.reject(error);
    }
  }

  /**
   * Runs `work` in a slot of `name` and gives the slot back when it settles, whatever way. Refused:
   * rejects with `RateLimitConcurrencyError` (`ERR_RATE_LIMIT_CONCURRENCY_LIMITED`) and `work` never runs;
   * the store failing under `failureMode: 'closed'`: `RateLimitUnavailableError`.
   */
  async withSlot<T>(name: string, options: SlotOptions, work: () => T | Promise<T>): Promise<T> {
    assertBucketName(name, 'withSlot');
    const take = slotTake(slotKey(serviceKey(this.options.keyPrefix, name, this.hash)), name, options, this.options, 'withSlot');
    const slot = await this.slots.take(take);
    if (!slot.held) {
      if (slot.source === 'closed') throw new RateLimitUnavailableError('failureMode is closed');
      throw new RateLimitConcurrencyError(slot.limit, slot.inFlight, slot.retryAfterSeconds, name);
    }
    try {
      return await work();
    } finally {
      await slot.release();
    }
  }

  /**
   * Takes `cost` tokens from the bucket `name` if it has them. With `failureMode: 'closed'` a store
   * failure throws `RateLimitUnavailableError`; with `'open'` the decision is allowed as if the bucket were full.
   */
  async consume(name: string, policy: PrioritizedPolicy, cost = 1): Promise<BucketDecision> {
    // consumeAll() of one entry, without its arrays and its extra await: this is the hot path of callers.
    const verdict = await this.decide([this.request({ name, policy }, cost, 'consume')]);
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
    if (!Array.isArray(entries)) {
      throw new RateLimitConfigError(
        'ERR_RATE_LIMIT_INVALID_CONSUME_ALL',
        `BucketService.consumeAll(): entries must be an array of { name, policy, cost? } (got ${describeValue(entries)})`,
      );
    }
    const requests = entries.map((entry, i) => this.request(entry, entry?.cost ?? 1, 'consumeAll', i));
    assertRepeatsFit(entries, requests);
    const verdict = await this.decide(requests);
    if (verdict.source === 'closed') throw new RateLimitUnavailableError('failureMode is closed');
    return { allowed: verdict.allowed, decisions: verdict.decisions };
  }

  /** What `consume(name, policy)` would decide now, without taking a token. */
  async peek(name: string, policy: BucketPolicy): Promise<BucketDecision> {
    const verdict = await this.decide([this.request({ name, policy }, 1, 'peek')], true);
    if (verdict.source === 'closed') throw new RateLimitUnavailableError('failureMode is closed');
    return verdict.decisions[0];
  }

  /**
   * Gives `cost` tokens back to the bucket `name` (capped at its capacity), for work that turned out not
   * to count — the refund of an earlier `consume()`. Answers the bucket's decision after the refund
   * (`allowed` true). With `failureMode: 'closed'` a store failure throws `RateLimitUnavailableError`;
   * with `'open'` nothing is given back and the bucket is reported as full.
   */
  async refund(name: string, policy: PrioritizedPolicy, cost = 1): Promise<BucketDecision> {
    const request = this.request({ name, policy }, cost, 'refund');
    const tokens = await this.giveBack([request], 'store');
    if (tokens === undefined) {
      if (this.options.failureMode === 'closed') throw new RateLimitUnavailableError('failureMode is closed');
      return toDecision(request, request.capacity, 0, true);
    }
    return toDecision(request, tokens[0], 0, true);
  }

  /** True while the store keeps failing (the breaker is open): one decision at a time probes it, the others follow `failureMode`. */
  get storeFailing(): boolean {
    return this.engine.storeFailing;
  }

  /** How the store answers lately, and whether it can be asked now (see `RateLimitHealth`). */
  storeHealth(): EngineHealth & { reachable: boolean } {
    return { ...this.engine.health(), reachable: this.store.reachable?.() ?? true };
  }

  /**
   * Makes the bucket `name` full again. Rejects with `RateLimitUnavailableError` when the store fails or
   * does not answer within `timeoutMs`, whatever `failureMode`: the bucket was not reset.
   */
  async reset(name: string): Promise<void> {
    assertBucketName(name, 'reset');
    await this.engine.deleteBucket(serviceKey(this.options.keyPrefix, name, this.hash));
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
    const request = this.routeBuckets(who, where).peekRequest(scope, who, policy, where);
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
    const where = `BucketService.resetRoute(${JSON.stringify(scope)})`;
    await this.engine.deleteBucket(this.routeBuckets(who, where).keyOf(scope, who, where));
  }

  /** Forgets the route bucket of a key the caller built (`RateLimitInsights.reset()`): as `resetRoute()` does. */
  async deleteRouteKey(key: string): Promise<void> {
    await this.engine.deleteBucket(key);
  }

  /** The route buckets, after checking `who`. */
  private routeBuckets(who: RouteIdentity, where: string): RouteBuckets {
    assertRouteIdentity(who, where);
    if (this.routes === undefined) {
      throw new RateLimitConfigError(
        'ERR_RATE_LIMIT_UNKNOWN_SCOPE',
        `${where}: this BucketService knows no routes (it was not created by RateLimitModule)`,
      );
    }
    return this.routes;
  }

  /** One atomic decision over `requests`: the engine's (`DecisionEngine.decide`), the one the guard decides through. */
  decide(requests: readonly BucketRequest[], dryRun = false): Promise<Verdict> {
    return this.engine.decide(requests, dryRun);
  }

  /** Gives back what an allowed decision of `source` took (`DecisionEngine.giveBack`). */
  giveBack(requests: readonly BucketRequest[], source: VerdictSource): Promise<number[] | undefined> {
    return this.engine.giveBack(requests, source);
  }

  /** The request of one bucket (`serviceRequest`), under this service's key prefix and digest. */
  private request(entry: BucketEntry, cost: number, method: BucketMethod, index?: number): BucketRequest {
    return serviceRequest(entry, cost, method, this.options.keyPrefix, this.hash, index);
  }
}
