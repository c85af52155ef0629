import { Logger, type OnModuleDestroy, type OnModuleInit } from '@nestjs/common';
import { Cluster } from 'ioredis';
import { type BucketRequest, type PenaltyReport, penaltyCostOf } from '../token-bucket.js';
import { CONNECT_WAIT_MS } from '../../rate-limit.constants.js';
import type { BucketStore, TakeOptions, TakeResult } from '../bucket-store.interface.js';
import { diagnosticsOf, type RedisClient, type RedisDiagnostics } from './redis-connection.js';
import { checkAtStartup, type StartupCheckSettings } from './redis-startup.check.js';
import { TOKEN_BUCKET_COMMAND, TOKEN_BUCKET_LUA, type TokenBucketMode } from './token-bucket.script.js';

type Result = TakeResult & PenaltyReport;

type ScriptCommand = (...args: (string | number)[]) => Promise<unknown>;

export { createRedisClient } from './redis-connection.js';

/** How long shutdown waits for QUIT's reply before it drops the connection (a paused Redis never answers). */
export const QUIT_WAIT_MS = 500;

/** Waits for `promise` at most `ms`; answers whether it settled in time. Leaves no timer behind. */
async function settlesWithin(promise: Promise<unknown>, ms: number): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<false>((resolve) => (timer = setTimeout(resolve, ms, false)));
  try {
    return await Promise.race([promise.then(() => true), late]);
  } finally {
    clearTimeout(timer);
  }
}

/** The first `{...}` of a key: what Redis Cluster hashes to pick the slot. */
function hashTag(key: string): string {
  const open = key.indexOf('{');
  const close = key.indexOf('}', open + 1);
  return open >= 0 && close > open + 1 ? key.slice(open + 1, close) : key;
}

/** The Cluster slot of a hash tag: CRC16 (XMODEM: polynomial 0x1021, initial 0) of its bytes, modulo 16384. */
export function keySlot(tag: string): number {
  let crc = 0;
  for (const byte of Buffer.from(tag, 'utf8')) {
    crc ^= byte << 8;
    for (let bit = 0; bit < 8; bit++) crc = crc & 0x8000 ? ((crc << 1) ^ 0x1021) & 0xffff : (crc << 1) & 0xffff;
  }
  return crc & 0x3fff;
}

/**
 * Buckets in Redis, decided by one EVALSHA of the token-bucket script per decision.
 * On a Cluster, buckets of one identity share a hash tag and are decided together; buckets of
 * different identities are decided group by group, and a denial gives back what earlier groups took.
 */
export class RedisBucketStore implements BucketStore, OnModuleInit, OnModuleDestroy {
  readonly remote = true;
  private readonly logger = new Logger('RateLimit');
  private readonly script: ScriptCommand;
  /** Why a client the module created cannot connect; undefined for a client the application passed in. */
  private readonly diagnostics: RedisDiagnostics | undefined;
  /** The start failed and the connection was dropped (`abandon`): nothing more to report about it. */
  private abandoned = false;

  constructor(
    readonly client: RedisClient,
    private readonly owned: boolean,
    /** Decisions pending in the same event-loop turn share one script call (see `run`). */
    private readonly coalesce = true,
    /** The start-up check of a client the module created; undefined: none (the old wait of up to 1 s). */
    private readonly startup?: StartupCheckSettings,
  ) {
    client.defineCommand(TOKEN_BUCKET_COMMAND, { lua: TOKEN_BUCKET_LUA });
    this.nodeOf = client instanceof Cluster ? (key) => this.masterOf(key) : undefined;
    const command = (client as unknown as Record<string, ScriptCommand>)[TOKEN_BUCKET_COMMAND];
    this.script = command.bind(client);
    // A client the module created reports its connection errors, throttled; a client the application
    // passed in gets no listener (adding one would hide ioredis' own report of unhandled 'error' events).
    if (owned) this.diagnostics = diagnosticsOf(client);
    else if (client.options.enableOfflineQueue !== false) {
      this.logger.warn(
        'The Redis client given to RateLimitModule queues commands while disconnected, so decisions that ' +
          'timed out are replayed when it reconnects: create it with { enableOfflineQueue: false }',
      );
    }
  }

  async onModuleInit(): Promise<void> {
    if (this.client instanceof Cluster && this.client.status === 'ready') await this.connectMasters(this.client);
    if (!this.owned || this.client.status === 'ready') return;
    if (this.client.status === 'wait') this.client.connect().catch(() => undefined);
    if (this.startup && this.startup.mode !== false && this.diagnostics) {
      return checkAtStartup(this.client, this.diagnostics, this.script, this.startup);
    }
    const ready = new Promise<void>((resolve) => this.client.once('ready', resolve));
    if (!(await settlesWithin(ready, CONNECT_WAIT_MS)) && !this.abandoned) this.diagnostics?.notReadyAtStart();
  }

  abandon(): void {
    if (!this.owned) return;
    this.abandoned = true;
    this.client.disconnect();
  }

  /**
   * A Cluster opens its node connections on first use, and without an offline queue the commands
   * that arrive while one is opening fail: connect every master before the first decision.
   */
  private async connectMasters(cluster: Cluster): Promise<void> {
    const pings = Promise.all(cluster.nodes('master').map((node) => node.ping().catch(() => undefined)));
    await settlesWithin(pings, CONNECT_WAIT_MS);
  }

  /**
   * Closes a client the module created: QUIT, so that commands in flight get their replies; but a hung
   * Redis (paused, overloaded, a dead network path) never answers it, so after `QUIT_WAIT_MS` the
   * connection is dropped and shutdown goes on.
   */
  async onModuleDestroy(): Promise<void> {
    if (!this.owned) return;
    const quit = this.client.quit().then(
      () => true,
      () => false,
    );
    if (!(await settlesWithin(quit, QUIT_WAIT_MS)) || !(await quit)) this.client.disconnect();
  }

  /** On a Cluster, the master that owns the key's slot (ioredis' slot table, kept current by its refreshes). */
  readonly nodeOf: ((key: string) => string | undefined) | undefined;

  private masterOf(key: string): string | undefined {
    return (this.client as Cluster).slots[keySlot(hashTag(key))]?.[0];
  }

  take(requests: readonly BucketRequest[], options: TakeOptions = {}): Promise<Result> {
    const mode: TokenBucketMode = options.refund ? 'refund' : options.dryRun ? 'peek' : 'take';
    const { now, sent } = options;
    if (!(this.client instanceof Cluster) || requests.length < 2) {
      return this.run(requests, mode, now, sent);
    }
    const groups = new Map<string, number[]>();
    requests.forEach((request, i) => {
      const tag = hashTag(request.key);
      const group = groups.get(tag);
      if (group) group.push(i);
      else groups.set(tag, [i]);
    });
    if (groups.size === 1) return this.run(requests, mode, now, sent);
    return this.takeByGroup(requests, [...groups.values()], mode, now, sent);
  }

  async delete(keys: readonly string[]): Promise<void> {
    // One DEL per key: on a Cluster, keys of different slots cannot share a command.
    await Promise.all(keys.map((key) => this.client.del(key)));
  }

  private async takeByGroup(
    requests: readonly BucketRequest[],
    groups: number[][],
    mode: TokenBucketMode,
    now: number | undefined,
    sent: (() => void) | undefined,
  ): Promise<Result> {
    const tokens = new Array<number>(requests.length);
    const penaltyMs = hasPenalty(requests) ? new Array<number>(requests.length).fill(0) : undefined;
    const pick = (group: number[]) => group.map((i) => requests[i]);
    const record = (group: number[], result: Result) =>
      group.forEach((i, j) => {
        tokens[i] = result.tokens[j];
        if (penaltyMs !== undefined) penaltyMs[i] = result.penaltyMs?.[j] ?? 0;
      });
    const answer = (allowed: boolean): Result => (penaltyMs === undefined ? { allowed, tokens } : { allowed, tokens, penaltyMs });
    for (let g = 0; g < groups.length; g++) {
      // The deadline runs from the first group's call: the later ones are part of the same decision.
      const result = await this.run(pick(groups[g]), mode, now, g === 0 ? sent : undefined);
      record(groups[g], result);
      if (!result.allowed) {
        const earlier = groups.slice(0, g);
        const later = groups.slice(g + 1);
        const [refunded, peeked] = await Promise.all([
          Promise.all(earlier.map((group) => this.run(pick(group), mode === 'take' ? 'refund' : 'peek', now, undefined))),
          Promise.all(later.map((group) => this.run(pick(group), 'peek', now, undefined))),
        ]);
        earlier.forEach((group, k) => record(group, refunded[k]));
        later.forEach((group, k) => record(group, peeked[k]));
        return answer(false);
      }
    }
    return answer(true);
  }

  /**
   * Sends one decision. With `coalesce` on, the first decision of an event-loop turn (per Cluster slot)
   * goes out at once, alone; the ones that arrive after it in the same turn wait only for the turn to
   * end (setImmediate, after the I/O callbacks of this turn) and then share one script call, which
   * decides each on its own, in order, atomically per decision. Nothing ever waits for more decisions
   * to come, so a lone request pays nothing, and each request still costs at most one round trip.
   * A decision with a clock override (tests) always goes alone.
   *
   * `sent` is called when the decision's command is handed to the client: at once for a decision that
   * goes alone, at the end of the turn for one that waited. Its deadline runs from then (`Deadlines`).
   */
  private run(
    requests: readonly BucketRequest[],
    mode: TokenBucketMode,
    now: number | undefined,
    sent: (() => void) | undefined,
  ): Promise<Result> {
    if (!this.coalesce || now !== undefined) return this.send(requests, mode, now, sent);
    const lane = this.nodeOf === undefined ? 0 : keySlot(hashTag(requests[0].key));
    let turn = this.turn;
    if (turn === undefined) {
      turn = this.turn = new Map();
      setImmediate(this.endTurn);
    }
    const waiting = turn.get(lane);
    if (waiting === undefined) {
      turn.set(lane, null);
      return this.send(requests, mode, undefined, sent);
    }
    return new Promise<Result>((resolve, reject) => {
      const decision: Queued = { requests, mode, sent, resolve, reject };
      if (waiting === null) turn.set(lane, [decision]);
      else waiting.push(decision);
    });
  }

  /** Per lane (Cluster slot, or 0): null once a decision went out alone this turn, then the ones queued after it. */
  private turn: Map<number, Queued[] | null> | undefined;

  private readonly endTurn = (): void => {
    const turn = this.turn;
    this.turn = undefined;
    if (turn === undefined) return;
    for (const waiting of turn.values()) {
      if (waiting === null) continue;
      for (let i = 0; i < waiting.length; i += MAX_DECISIONS_PER_CALL) {
        this.sendQueued(waiting.length <= MAX_DECISIONS_PER_CALL ? waiting : waiting.slice(i, i + MAX_DECISIONS_PER_CALL));
      }
    }
  };

  /** One decision in a call of its own. */
  private send(
    requests: readonly BucketRequest[],
    mode: TokenBucketMode,
    now: number | undefined,
    sent: (() => void) | undefined,
  ): Promise<Result> {
    if (requests.length === 1 && !hasPenalty(requests)) {
      // The usual call: one bucket, one integer back.
      if (this.diagnostics !== undefined && this.client.status !== 'ready') {
        return Promise.reject(this.diagnostics.notConnected());
      }
      const { key, capacity, refillPerSecond, cost } = requests[0];
      const header = 8 + MODE_CODE[mode];
      sent?.();
      const call =
        now === undefined
          ? this.evaluate([1, key, header, capacity, refillPerSecond, cost])
          : this.evaluate([1, key, header, capacity, refillPerSecond, cost, now]);
      return call.then(decodeOne);
    }
    return this.decide([{ requests, mode, sent }], now).then(([result]) => {
      if (result instanceof Error) throw result;
      return result;
    });
  }

  /** Decisions that waited for the end of the turn: one call; each settles with its own result. */
  private sendQueued(queued: readonly Queued[]): void {
    if (queued.length === 1) {
      const [{ requests, mode, sent, resolve, reject }] = queued;
      this.send(requests, mode, undefined, sent).then(resolve, reject);
      return;
    }
    this.decide(queued, undefined).then(
      (results) =>
        queued.forEach((decision, i) => {
          const result = results[i];
          if (result instanceof Error) decision.reject(result);
          else decision.resolve(result);
        }),
      (error: unknown) => queued.forEach((decision) => decision.reject(error)),
    );
  }

  /** One call for `decisions`, in order: per decision its result, or the script's refusal of its numbers. */
  private decide(decisions: readonly Pick<Queued, 'requests' | 'mode' | 'sent'>[], now: number | undefined): Promise<(Result | Error)[]> {
    // Without an offline queue ioredis would refuse the command anyway ("Stream isn't writeable"): say
    // where and why instead.
    if (this.diagnostics !== undefined && this.client.status !== 'ready') {
      return Promise.reject(this.diagnostics.notConnected());
    }
    const keys: string[] = [];
    const argv: (string | number)[] = [];
    for (const decision of decisions) appendDecision(keys, argv, decision.requests, decision.mode);
    if (now !== undefined) argv.push(now);
    for (const decision of decisions) decision.sent?.();
    return this.evaluate([keys.length, ...keys, ...argv]).then((reply) =>
      decodeMany(
        reply,
        decisions.map((decision) => decision.requests),
      ),
    );
  }

  /**
   * ioredis answers a NOSCRIPT (Redis lost its script cache) by sending the script once more; when
   * the cache is flushed again before that reload runs, the reload fails too. One more try sends the
   * body again; a NOSCRIPT means the script did not run, so no decision is taken twice.
   */
  private evaluate(args: (string | number)[]): Promise<unknown> {
    return this.script(...args).catch((error: unknown) => {
      if (!(error instanceof Error) || !error.message.startsWith('NOSCRIPT')) throw error;
      return this.script(...args);
    });
  }
}

/** At most this many decisions share one script call (a script holds Redis while it runs). */
export const MAX_DECISIONS_PER_CALL = 64;

const MODE_CODE: Record<TokenBucketMode, number> = { take: 0, peek: 1, refund: 2 };

/** A decision waiting for the end of the event-loop turn. */
interface Queued {
  requests: readonly BucketRequest[];
  mode: TokenBucketMode;
  /** Starts the decision's deadline when its call is handed to the client. */
  sent: (() => void) | undefined;
  resolve: (result: Result) => void;
  reject: (error: unknown) => void;
}

/** Adds one decision's header, keys and numbers to a call (see the script's header comment). */
function appendDecision(keys: string[], argv: (string | number)[], requests: readonly BucketRequest[], mode: TokenBucketMode): void {
  const penalty = hasPenalty(requests);
  argv.push(requests.length * 8 + (penalty ? 4 : 0) + MODE_CODE[mode]);
  for (const request of requests) {
    keys.push(request.key);
    argv.push(request.capacity, request.refillPerSecond, request.cost);
    // Anything but absent or 0 goes to the script, which refuses a blockSeconds out of bounds.
    if (penalty) argv.push(request.blockSeconds ?? 0, penaltyCostOf(request));
  }
}

function hasPenalty(requests: readonly BucketRequest[]): boolean {
  // Anything but absent or 0 goes to the script, which refuses a blockSeconds out of bounds.
  for (const request of requests) if (request.blockSeconds !== undefined && request.blockSeconds !== 0) return true;
  return false;
}

/** The tokens a code from the script carries (see its header comment): exact arithmetic on doubles. */
export function decodeTokens(code: number): number {
  const v = (code % 2 !== 0 ? code - 1 : code) / 2;
  const biased = ((v % 128) + 128) % 128;
  return ((v - biased) / 128) * 2 ** (biased - 64 - 45);
}

/**
 * The tokens a bucket reports from Redis when it holds `tokens`: rounded down to 45 significant bits
 * (and to a multiple of 2^-105 below 2^-61), as the script's code carries them. Written here
 * independently of the Lua, for tests and for anyone who compares the two stores.
 */
export function reportedTokens(tokens: number): number {
  if (tokens === 0) return 0;
  if (!Number.isFinite(tokens)) return tokens;
  let e = Math.floor(Math.log2(Math.abs(tokens))) + 1;
  if (2 ** (e - 1) > Math.abs(tokens)) e -= 1;
  else if (2 ** e <= Math.abs(tokens)) e += 1;
  if (e < -60) e = -60;
  return Math.floor(tokens * 2 ** (45 - e)) * 2 ** (e - 45);
}

function badCode(value: unknown): TypeError {
  return new TypeError(`token-bucket script: expected an integer code, got ${JSON.stringify(value)}`);
}

function decodeOne(reply: unknown): Result {
  if (typeof reply !== 'number' || !Number.isSafeInteger(reply)) throw badCode(reply);
  return { allowed: reply % 2 !== 0, tokens: [decodeTokens(reply)] };
}

/** The array reply of a call with several buckets or decisions: one result, or the script's refusal, per decision. */
function decodeMany(reply: unknown, decisions: readonly (readonly BucketRequest[])[]): (Result | Error)[] {
  if (!Array.isArray(reply)) throw new TypeError(`token-bucket script: expected an array, got ${JSON.stringify(reply)}`);
  const results: (Result | Error)[] = [];
  let at = 0;
  for (const requests of decisions) {
    const first = reply[at];
    if (typeof first === 'string') {
      results.push(new Error(first));
      at += 1;
      continue;
    }
    const n = requests.length;
    const tokens = new Array<number>(n);
    for (let i = 0; i < n; i++) {
      const code: unknown = reply[at + i];
      if (typeof code !== 'number' || !Number.isSafeInteger(code)) throw badCode(code);
      tokens[i] = decodeTokens(code);
    }
    const allowed = (first as number) % 2 !== 0;
    at += n;
    if (!hasPenalty(requests)) {
      results.push({ allowed, tokens });
      continue;
    }
    const penaltyMs = new Array<number>(n);
    for (let i = 0; i < n; i++) {
      const value = Number(reply[at + i]);
      penaltyMs[i] = Number.isFinite(value) && value > 0 ? value : 0;
    }
    at += n;
    results.push({ allowed, tokens, penaltyMs });
  }
  if (at !== reply.length) throw new TypeError(`token-bucket script: expected ${at} values, got ${reply.length}`);
  return results;
}
