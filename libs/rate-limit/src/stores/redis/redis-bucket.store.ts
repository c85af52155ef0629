import { Logger, type OnModuleDestroy, type OnModuleInit } from '@nestjs/common';
import { Cluster } from 'ioredis';
import { CONNECT_WAIT_MS } from '../../rate-limit.constants.js';
import type { BucketStore, TakeOptions } from '../bucket-store.interface.js';
import type { BucketRequest } from '../token-bucket.js';
import { tagGroups, takeByGroup } from './cluster-groups.js';
import { hashTag, keySlot } from './cluster-slots.js';
import { Coalescer } from './coalescer.js';
import { type DecisionCalls, decideAll, type StoreDecisionCall } from './decide-all.js';
import { ownedConnectionOf, type OwnedConnection } from './owned-connection.js';
import { connectMasters, quitOrDrop, settlesWithin } from './store-lifecycle.js';
import { diagnosticsOf, type RedisDiagnostics } from './redis-diagnostics.js';
import type { RedisClient } from './redis-options.validation.js';
import { checkAtStartup, type StartupCheckSettings } from './redis-startup.check.js';
import { DECIDE_SCRIPT, GIVE_BACK_SCRIPT, LEASE_SCRIPT, LUA_SCRIPTS, type LuaScript, RESERVE_SCRIPT } from './lua/lua-scripts.js';
import type { SlotAnswer, SlotCallOptions, SlotRelease, SlotRequest, SlotStore, SlotTakeResult } from '../slots.js';
import { RedisSlots } from './redis-slots.js';
import {
  appendGiveBack,
  appendLease,
  appendReservations,
  callError,
  type DecisionExtra,
  decodeOne,
  decodeLease,
  decodeReserve,
  hasFloor,
  hasPenalty,
  type LeaseAnswer,
  type LeaseAsk,
  MODE_CODE,
  type ScriptResult as Result,
  type TokenBucketMode,
} from './lua/script-codec.js';

type ScriptCommand = (...args: (string | number)[]) => Promise<unknown>;

/**
 * Buckets in Redis, decided by one EVALSHA of a script per decision (lua/: decide.lua for take, peek and
 * refund, reserve.lua and give-back.lua for acquire()).
 * On a Cluster, buckets of one identity share a hash tag and are decided together; buckets of
 * different identities are decided group by group, and a denial gives back what earlier groups took.
 */
export class RedisBucketStore implements BucketStore, SlotStore, OnModuleInit, OnModuleDestroy {
  readonly remote = true;
  private readonly logger = new Logger('RateLimit');
  /** The scripts as commands of the client, by their `.lua` name. */
  private readonly scripts = new Map<LuaScript, ScriptCommand>();
  /** decide.lua: what the start-up check runs. */
  private readonly script: ScriptCommand;
  /** Why a client the module created cannot connect; undefined for a client the application passed in. */
  private readonly diagnostics: RedisDiagnostics | undefined;
  /** The start failed and the connection was dropped (`abandon`): nothing more to report about it. */
  private abandoned = false;
  /** What the module adds to a client it created (revival, the Sentinel watch); undefined for the application's own. */
  private readonly connection: OwnedConnection | undefined;
  /** Decisions pending in the same event-loop turn share one script call; undefined when `coalesce` is off. */
  private readonly coalescer: Coalescer | undefined;
  /** The calls of `decideAll`: decisions of one turn in as few script calls as their scripts allow. */
  private readonly calls: DecisionCalls = {
    notReady: () => this.notReady(),
    evaluate: (script, args) => this.evaluate(script, args),
    answered: (count) => this.connection?.answered(count),
    alone: (requests, mode, now, sent, extra) => this.send(requests, mode, now, sent, extra),
  };
  /** Concurrency slots (`SlotStore`). */
  private readonly slots = new RedisSlots({
    evaluate: (script, args) => {
      const down = this.notReady();
      return down === undefined ? this.evaluate(script, args) : Promise.reject(down);
    },
    take: (requests, options) => this.take(requests, options),
    oneCall: (keys) => this.nodeOf === undefined || keys.every((key) => hashTag(key) === hashTag(keys[0])),
  });

  constructor(
    readonly client: RedisClient,
    private readonly owned: boolean,
    /** Decisions pending in the same event-loop turn share one script call (`Coalescer`). */
    coalesce = true,
    /** The start-up check of a client the module created; undefined: none (the old wait of up to 1 s). */
    private readonly startup?: StartupCheckSettings,
  ) {
    for (const script of LUA_SCRIPTS) {
      client.defineCommand(script.command, { lua: script.lua });
      this.scripts.set(script, (client as unknown as Record<string, ScriptCommand>)[script.command].bind(client));
    }
    this.script = this.scripts.get(DECIDE_SCRIPT)!;
    this.nodeOf = client instanceof Cluster ? (key) => this.masterOf(key) : undefined;
    this.coalescer = coalesce
      ? new Coalescer(
          (requests, mode, sent, extra) => this.send(requests, mode, undefined, sent, extra),
          (queued) => this.decide(queued, undefined),
          this.nodeOf !== undefined,
        )
      : undefined;
    // A client the module created reports its connection errors, throttled; a client the application
    // passed in gets no listener (adding one would hide ioredis' own report of unhandled 'error' events).
    if (owned) {
      this.diagnostics = diagnosticsOf(client);
      this.connection = ownedConnectionOf(client);
    } else if (client.options.enableOfflineQueue !== false) {
      this.logger.warn(
        'The Redis client given to RateLimitModule queues commands while disconnected, so decisions that ' +
          'timed out are replayed when it reconnects: create it with { enableOfflineQueue: false }',
      );
    }
  }

  async onModuleInit(): Promise<void> {
    if (this.client instanceof Cluster && this.client.status === 'ready') await connectMasters(this.client);
    if (!this.owned) return;
    this.connection?.start();
    if (this.client.status === 'ready') return;
    if (this.client.status === 'wait') this.client.connect().catch(() => undefined);
    if (this.startup && this.startup.mode !== false && this.diagnostics) {
      try {
        return await checkAtStartup(this.client, this.diagnostics, this.script, this.startup);
      } catch (error) {
        this.connection?.stop();
        throw error;
      }
    }
    const ready = new Promise<void>((resolve) => this.client.once('ready', resolve));
    if (!(await settlesWithin(ready, CONNECT_WAIT_MS)) && !this.abandoned) this.diagnostics?.notReadyAtStart();
  }

  abandon(): void {
    if (!this.owned) return;
    this.abandoned = true;
    this.connection?.stop();
    this.client.disconnect();
  }

  /** Closes a client the module created (QUIT, or the connection dropped when Redis does not answer it: `quitOrDrop`). */
  async onModuleDestroy(): Promise<void> {
    if (!this.owned) return;
    this.connection?.stop();
    await quitOrDrop(this.client);
  }

  /** Whether the client is connected and ready (a Cluster: its slots known and connected). */
  reachable(): boolean {
    return this.client.status === 'ready';
  }

  /** On a Cluster, the master that owns the key's slot (ioredis' slot table, kept current by its refreshes). */
  readonly nodeOf: ((key: string) => string | undefined) | undefined;

  private masterOf(key: string): string | undefined {
    return (this.client as Cluster).slots[keySlot(hashTag(key))]?.[0];
  }

  take(requests: readonly BucketRequest[], options: TakeOptions = {}): Promise<Result> {
    const mode: TokenBucketMode = options.refund ? 'refund' : options.dryRun ? 'peek' : 'take';
    const { now, sent } = options;
    if (options.reserve !== undefined) {
      if (requests.length !== 1) {
        return Promise.reject(new RangeError(`RedisBucketStore: a reservation is of one bucket (got ${requests.length})`));
      }
      return this.run(requests, mode, now, sent, { reserve: options.reserve });
    }
    if (options.givesBack !== undefined && mode === 'refund' && requests.length === 1) {
      return this.run(requests, mode, now, sent, { givesBack: options.givesBack });
    }
    if (!(this.client instanceof Cluster) || requests.length < 2) {
      return this.run(requests, mode, now, sent);
    }
    const groups = tagGroups(requests);
    if (groups.length === 1) return this.run(requests, mode, now, sent);
    return takeByGroup(requests, groups, mode, sent, (part, partMode, partSent) => this.run(part, partMode, now, partSent));
  }

  async delete(keys: readonly string[]): Promise<void> {
    // One DEL per key: on a Cluster, keys of different slots cannot share a command.
    await Promise.all(keys.map((key) => this.client.del(key)));
  }

  /**
   * Sends one decision: through the coalescer (`coalesce`), which lets the decisions of one event-loop
   * turn share a call, or alone. A decision with a clock override (tests) always goes alone.
   */
  private run(
    requests: readonly BucketRequest[],
    mode: TokenBucketMode,
    now: number | undefined,
    sent: (() => void) | undefined,
    extra?: DecisionExtra,
  ): Promise<Result> {
    if (this.coalescer === undefined || now !== undefined) return this.send(requests, mode, now, sent, extra);
    return this.coalescer.run(requests, mode, sent, extra);
  }

  /** One decision in a call of its own. */
  private send(
    requests: readonly BucketRequest[],
    mode: TokenBucketMode,
    now: number | undefined,
    sent: (() => void) | undefined,
    extra?: DecisionExtra,
  ): Promise<Result> {
    if (extra !== undefined) return this.sendExtra(requests[0], now, sent, extra);
    if (requests.length === 1 && !hasPenalty(requests) && !(mode === 'take' && hasFloor(requests))) {
      // The usual call: one bucket, one integer back.
      const down = this.notReady();
      if (down !== undefined) return Promise.reject(down);
      const { key, capacity, refillPerSecond, cost } = requests[0];
      const header = 8 + MODE_CODE[mode];
      sent?.();
      const call =
        now === undefined
          ? this.evaluate(DECIDE_SCRIPT, [1, key, header, capacity, refillPerSecond, cost])
          : this.evaluate(DECIDE_SCRIPT, [1, key, header, capacity, refillPerSecond, cost, now]);
      return this.connection === undefined ? call.then(decodeOne) : call.then((reply) => (this.connection!.answered(1), decodeOne(reply)));
    }
    return this.decide([{ requests, mode, sent, extra: undefined }], now).then(([result]) => {
      if (result instanceof Error) throw result;
      return result;
    });
  }

  /** A reservation, or the give-back of one, in a call of its own. */
  private sendExtra(
    request: BucketRequest,
    now: number | undefined,
    sent: (() => void) | undefined,
    extra: DecisionExtra,
  ): Promise<Result> {
    const { reserve, givesBack } = extra;
    const keys: string[] = [];
    const argv: (string | number)[] = [];
    if (reserve) appendReservations(keys, argv, request, reserve.boundMs, [{ cost: request.cost, maxWaitMs: reserve.maxWaitMs }]);
    else appendGiveBack(keys, argv, request, givesBack!);
    return this.single(reserve ? RESERVE_SCRIPT : GIVE_BACK_SCRIPT, keys, argv, now, sent, reserve ? decodeReserve : decodeOne);
  }

  /**
   * One call of lease.lua: gives back and keeps what `ask` says of this holder's live lease of
   * `request`'s bucket, and leases up to `ask.want` more tokens (see the script's header). `now`: tests.
   */
  lease(request: BucketRequest, ask: LeaseAsk, now?: number, sent?: () => void): Promise<LeaseAnswer> {
    const keys: string[] = [];
    const argv: (string | number)[] = [];
    appendLease(keys, argv, request, ask);
    return this.single(LEASE_SCRIPT, keys, argv, now, sent, decodeLease);
  }

  /** One call of one key's script on a ready connection (`now` last, for tests), its reply decoded. */
  private single<T>(
    script: LuaScript,
    keys: string[],
    argv: (string | number)[],
    now: number | undefined,
    sent: (() => void) | undefined,
    decode: (reply: unknown) => T,
  ): Promise<T> {
    const down = this.notReady();
    if (down !== undefined) return Promise.reject(down);
    if (now !== undefined) argv.push(now);
    sent?.();
    return this.evaluate(script, [keys.length, ...keys, ...argv]).then((reply) => {
      this.connection?.answered(1);
      return decode(reply);
    });
  }

  /** One call of slot-take.lua: a concurrency slot taken or renewed (see its header). */
  takeSlot(request: SlotRequest, options: SlotCallOptions = {}): Promise<SlotAnswer> {
    return this.slots.take(request, options);
  }

  /** One call of slot-give-back.lua: the holder's slot given back. */
  giveBackSlot(key: string, holder: string, options: SlotCallOptions = {}): Promise<SlotRelease> {
    return this.slots.giveBack(key, holder, options);
  }

  /** A take and a slot decided together: one call of take-with-slot.lua (`RedisSlots.takeWith`). */
  takeWithSlot(
    requests: readonly BucketRequest[],
    slot: SlotRequest,
    options: Pick<TakeOptions, 'now' | 'sent'> = {},
  ): Promise<SlotTakeResult> {
    return this.slots.takeWith(requests, slot, options);
  }

  /** `decisions`, in order: per decision its result, or the script's refusal of it (`decideAll`). */
  private decide(decisions: readonly StoreDecisionCall[], now: number | undefined): Promise<(Result | Error)[]> {
    return decideAll(this.calls, decisions, now);
  }

  /** Why no call can be sent now (without an offline queue ioredis would refuse it: "Stream isn't writeable"); undefined when it can. */
  private notReady(): Error | undefined {
    return this.diagnostics !== undefined && this.client.status !== 'ready' ? this.diagnostics.notConnected() : undefined;
  }

  /**
   * ioredis answers a NOSCRIPT (Redis lost its script cache) by sending the script once more; when
   * the cache is flushed again before that reload runs, the reload fails too. One more try sends the
   * body again; a NOSCRIPT means the script did not run, so no decision is taken twice.
   */
  private evaluate(script: LuaScript, args: (string | number)[]): Promise<unknown> {
    return this.call(script, args)
      .catch((error: unknown) => {
        if (!(error instanceof Error) || !error.message.startsWith('NOSCRIPT')) throw error;
        return this.call(script, args);
      })
      .catch((error: unknown) => {
        throw callError(error);
      });
  }

  /** One script call; a client the module created watches for its reply (`OwnedConnection.track`). */
  private call(script: LuaScript, args: (string | number)[]): Promise<unknown> {
    const call = this.scripts.get(script)!(...args);
    this.connection?.track(call);
    return call;
  }
}
