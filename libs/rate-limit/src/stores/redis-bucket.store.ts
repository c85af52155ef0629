import { Logger, type OnModuleDestroy, type OnModuleInit } from '@nestjs/common';
import { Cluster } from 'ioredis';
import type { BucketRequest, PenaltyReport } from '../bucket/token-bucket.js';
import { CONNECT_WAIT_MS } from '../rate-limit.constants.js';
import type { BucketStore, TakeOptions, TakeResult } from './bucket-store.interface.js';
import { diagnosticsOf, type RedisClient, type RedisDiagnostics } from './redis-connection.js';
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
    if (!(this.client instanceof Cluster) || requests.length < 2) {
      return this.run(requests, mode, options.now);
    }
    const groups = new Map<string, number[]>();
    requests.forEach((request, i) => {
      const tag = hashTag(request.key);
      const group = groups.get(tag);
      if (group) group.push(i);
      else groups.set(tag, [i]);
    });
    if (groups.size === 1) return this.run(requests, mode, options.now);
    return this.takeByGroup(requests, [...groups.values()], mode, options.now);
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
      const result = await this.run(pick(groups[g]), mode, now);
      record(groups[g], result);
      if (!result.allowed) {
        const earlier = groups.slice(0, g);
        const later = groups.slice(g + 1);
        const [refunded, peeked] = await Promise.all([
          Promise.all(earlier.map((group) => this.run(pick(group), mode === 'take' ? 'refund' : 'peek', now))),
          Promise.all(later.map((group) => this.run(pick(group), 'peek', now))),
        ]);
        earlier.forEach((group, k) => record(group, refunded[k]));
        later.forEach((group, k) => record(group, peeked[k]));
        return answer(false);
      }
    }
    return answer(true);
  }

  private run(
    requests: readonly BucketRequest[],
    mode: TokenBucketMode,
    now: number | undefined,
  ): Promise<Result> {
    // Without an offline queue ioredis would refuse the command anyway ("Stream isn't writeable"): say
    // where and why instead.
    if (this.diagnostics !== undefined && this.client.status !== 'ready') {
      return Promise.reject(this.diagnostics.notConnected());
    }
    const args: (string | number)[] = [requests.length];
    for (const request of requests) args.push(request.key);
    // Penalties cost one more argument per bucket, one more field read and a longer reply: only when
    // a bucket of the call has one.
    if (hasPenalty(requests)) {
      args.push(now === undefined ? '' : now, `${mode}+b`);
      for (const request of requests) {
        args.push(request.capacity, request.refillPerSecond, request.cost, request.blockSeconds ?? 0);
      }
      return this.evaluate(args).then((reply) => parseReply(reply, requests.length, true));
    }
    args.push(now === undefined ? '' : now, mode);
    for (const request of requests) args.push(request.capacity, request.refillPerSecond, request.cost);
    return this.evaluate(args).then((reply) => parseReply(reply, requests.length, false));
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

function hasPenalty(requests: readonly BucketRequest[]): boolean {
  // Anything but absent or 0 goes to the script, which refuses a blockSeconds out of bounds.
  for (const request of requests) if (request.blockSeconds !== undefined && request.blockSeconds !== 0) return true;
  return false;
}

function parseReply(reply: unknown, buckets: number, penalties: boolean): Result {
  const length = penalties ? 2 * buckets + 1 : buckets + 1;
  if (!Array.isArray(reply) || reply.length !== length) {
    throw new TypeError(`token-bucket script: expected ${length} values, got ${JSON.stringify(reply)}`);
  }
  const tokens = new Array<number>(buckets);
  for (let i = 0; i < buckets; i++) {
    const value = Number(reply[i + 1]);
    if (!Number.isFinite(value)) {
      throw new TypeError(`token-bucket script: tokens must be numeric, got ${JSON.stringify(reply[i + 1])}`);
    }
    tokens[i] = value;
  }
  const allowed = Number(reply[0]) === 1;
  if (!penalties) return { allowed, tokens };
  const penaltyMs = new Array<number>(buckets);
  for (let i = 0; i < buckets; i++) {
    const value = Number(reply[buckets + 1 + i]);
    penaltyMs[i] = Number.isFinite(value) && value > 0 ? value : 0;
  }
  return { allowed, tokens, penaltyMs };
}
