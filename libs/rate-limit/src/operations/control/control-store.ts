import { randomBytes } from 'node:crypto';
import type { Cluster, Redis } from 'ioredis';
import { RateLimitUnavailableError } from '../../errors/rate-limit.errors.js';
import { opsKey } from '../ops-keys.js';
import type { AuditEntry, BlockEntry, OverrideEntry } from '../operations.types.js';

/** What the store holds of the operator's changes: the version and the entries in force. */
export interface ControlSnapshot {
  version: string | undefined;
  overrides: OverrideEntry[];
  blocks: BlockEntry[];
}

/** Entries the audit trail keeps, newest first. */
export const AUDIT_LENGTH = 1000;

/**
 * Where overrides, blocks and the audit trail live: Redis (shared by every instance) or this process.
 * Every change writes a new version (random, so that a Redis restart that loses the keys, then a new
 * change, can never repeat a version an instance holds); instances compare it on their periodic call
 * and read the entries only when it changed.
 */
export interface ControlStore {
  /** The version now. */
  version(): Promise<string | undefined>;
  load(): Promise<ControlSnapshot>;
  /** Writes an override (`entry`), or removes the one of `remove` ([scope, identity]); with its audit entry, atomically. */
  writeOverride(field: string, entry: OverrideEntry | undefined, audit: AuditEntry): Promise<boolean>;
  writeBlock(target: string, entry: BlockEntry | undefined, audit: AuditEntry): Promise<boolean>;
  /** An audit entry of a change that is not an override or a block (a reset). */
  note(audit: AuditEntry): Promise<void>;
  audit(limit: number): Promise<AuditEntry[]>;
}

/** The hash field of an override: scope, then the identity or `*` (every identity). */
export function overrideField(scope: string, identity: string | undefined): string {
  return `${scope}\n${identity ?? '*'}`;
}

function newVersion(): string {
  return `${Date.now().toString(36)}.${randomBytes(6).toString('hex')}`;
}

/** Entries as written by this library; anything else (a hand edit, another version's shape) is skipped, never thrown. */
function parseAll<T>(values: Record<string, string>, valid: (entry: any) => boolean): T[] {
  const entries: T[] = [];
  for (const text of Object.values(values)) {
    try {
      const entry: unknown = JSON.parse(text);
      if (typeof entry === 'object' && entry !== null && valid(entry)) entries.push(entry as T);
    } catch {
      // skipped
    }
  }
  return entries;
}

/**
 * A Redis call of the operator's (a block, an override, the audit trail): its failure, whatever ioredis
 * says ("Stream isn't writeable" while it reconnects, a closed connection), is `ERR_RATE_LIMIT_UNAVAILABLE`
 * (a 503 from an admin endpoint), with Redis' error as its cause.
 */
function unavailable<T>(call: Promise<T>): Promise<T> {
  return call.catch((error: unknown) => {
    throw new RateLimitUnavailableError(error);
  });
}

const isOverride = (e: any): boolean => typeof e.scope === 'string' && typeof e.at === 'number' && typeof e.by === 'string';
const isBlock = (e: any): boolean => typeof e.target === 'string' && typeof e.until === 'number' && typeof e.by === 'string';

export class RedisControlStore implements ControlStore {
  readonly versionKey: string;
  private readonly overridesKey: string;
  private readonly blocksKey: string;
  private readonly auditKey: string;

  constructor(
    private readonly client: Redis | Cluster,
    prefix: string,
    private readonly clock: () => number = Date.now,
  ) {
    this.versionKey = opsKey(prefix, 'v');
    this.overridesKey = opsKey(prefix, 'overrides');
    this.blocksKey = opsKey(prefix, 'blocks');
    this.auditKey = opsKey(prefix, 'audit');
  }

  async version(): Promise<string | undefined> {
    return (await unavailable(this.client.get(this.versionKey))) ?? undefined;
  }

  async load(): Promise<ControlSnapshot> {
    const results = await unavailable(
      this.client.pipeline().get(this.versionKey).hgetall(this.overridesKey).hgetall(this.blocksKey).exec(),
    );
    const [version, overrides, blocks] = (results ?? []).map(([error, value]) => {
      if (error) throw new RateLimitUnavailableError(error);
      return value;
    });
    return {
      version: (version as string | null) ?? undefined,
      overrides: parseAll<OverrideEntry>(overrides as Record<string, string>, isOverride),
      blocks: parseAll<BlockEntry>(blocks as Record<string, string>, isBlock),
    };
  }

  writeOverride(field: string, entry: OverrideEntry | undefined, audit: AuditEntry): Promise<boolean> {
    return unavailable(
      this.write(this.overridesKey, field, entry, audit, (e: OverrideEntry) => e.until !== undefined && e.until <= this.clock()),
    );
  }

  writeBlock(target: string, entry: BlockEntry | undefined, audit: AuditEntry): Promise<boolean> {
    return unavailable(this.write(this.blocksKey, target, entry, audit, (e: BlockEntry) => e.until <= this.clock()));
  }

  async note(audit: AuditEntry): Promise<void> {
    await unavailable(
      this.client
        .multi()
        .lpush(this.auditKey, JSON.stringify(audit))
        .ltrim(this.auditKey, 0, AUDIT_LENGTH - 1)
        .exec(),
    );
  }

  async audit(limit: number): Promise<AuditEntry[]> {
    const texts = await unavailable(this.client.lrange(this.auditKey, 0, limit - 1));
    return texts.flatMap((text) => {
      try {
        return [JSON.parse(text) as AuditEntry];
      } catch {
        return [];
      }
    });
  }

  /**
   * One change in one transaction (the keys share a slot): the entry set or removed, entries that have
   * ended removed, a new version, the audit entry. True when something was there to remove (or set).
   */
  private async write<T>(key: string, field: string, entry: T | undefined, audit: AuditEntry, ended: (e: T) => boolean): Promise<boolean> {
    const all = await this.client.hgetall(key);
    const stale = Object.entries(all)
      .filter(([name, text]) => {
        if (name === field) return false;
        try {
          return ended(JSON.parse(text) as T);
        } catch {
          return true;
        }
      })
      .map(([name]) => name);
    const existed = Object.hasOwn(all, field);
    if (entry === undefined && !existed && stale.length === 0) return false;
    const multi = this.client.multi();
    if (stale.length > 0) multi.hdel(key, ...stale);
    if (entry !== undefined) multi.hset(key, field, JSON.stringify(entry));
    else multi.hdel(key, field);
    multi.set(this.versionKey, newVersion());
    if (entry !== undefined || existed) multi.lpush(this.auditKey, JSON.stringify(audit)).ltrim(this.auditKey, 0, AUDIT_LENGTH - 1);
    const results = await multi.exec();
    for (const [error] of results ?? []) if (error) throw error;
    return entry !== undefined || existed;
  }
}

/** The same in this process (`store: 'memory'`): one instance, nothing shared. */
export class MemoryControlStore implements ControlStore {
  private current: string | undefined;
  private readonly overrides = new Map<string, OverrideEntry>();
  private readonly blocks = new Map<string, BlockEntry>();
  private readonly trail: AuditEntry[] = [];

  constructor(private readonly clock: () => number = Date.now) {}

  version(): Promise<string | undefined> {
    return Promise.resolve(this.current);
  }

  load(): Promise<ControlSnapshot> {
    const now = this.clock();
    for (const [field, e] of this.overrides) if (e.until !== undefined && e.until <= now) this.overrides.delete(field);
    for (const [target, e] of this.blocks) if (e.until <= now) this.blocks.delete(target);
    return Promise.resolve({ version: this.current, overrides: [...this.overrides.values()], blocks: [...this.blocks.values()] });
  }

  writeOverride(field: string, entry: OverrideEntry | undefined, audit: AuditEntry): Promise<boolean> {
    return Promise.resolve(this.write(this.overrides, field, entry, audit));
  }

  writeBlock(target: string, entry: BlockEntry | undefined, audit: AuditEntry): Promise<boolean> {
    return Promise.resolve(this.write(this.blocks, target, entry, audit));
  }

  note(audit: AuditEntry): Promise<void> {
    this.push(audit);
    return Promise.resolve();
  }

  audit(limit: number): Promise<AuditEntry[]> {
    return Promise.resolve(this.trail.slice(0, limit));
  }

  private write<T>(map: Map<string, T>, field: string, entry: T | undefined, audit: AuditEntry): boolean {
    const existed = map.has(field);
    if (entry === undefined && !existed) return false;
    if (entry !== undefined) map.set(field, entry);
    else map.delete(field);
    this.current = newVersion();
    this.push(audit);
    return true;
  }

  private push(audit: AuditEntry): void {
    this.trail.unshift(audit);
    if (this.trail.length > AUDIT_LENGTH) this.trail.length = AUDIT_LENGTH;
  }
}
