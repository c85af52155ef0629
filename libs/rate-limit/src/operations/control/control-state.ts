import { BlockList, isIP } from 'node:net';
import type { BlockEntry, OverrideEntry } from '../operations.types.js';

/** The overrides of one scope: the one of every identity, and those of single identities. */
interface ScopeOverrides {
  all: OverrideEntry | undefined;
  byIdentity: Map<string, OverrideEntry>;
}

/** A range block, with the list that matches it alone (to tell which range held an address). */
interface RangeBlock {
  entry: BlockEntry;
  list: BlockList;
}

/**
 * What every request of this instance is decided with beyond the code: the overrides and blocks in
 * force, as the last periodic call read them from the store. Replaced whole when the store's version
 * changes; read on every request without a store call. `active` is false while nothing is in force,
 * so the request path pays one property read and nothing else.
 */
export class ControlState {
  /** Some override or block is in force. */
  active = false;
  /** The store's version this state was read at (`undefined`: never read). */
  version: string | undefined;
  private overrides = new Map<string, ScopeOverrides>();
  private exact = new Map<string, BlockEntry>();
  private ranges: RangeBlock[] = [];
  private anyRange: BlockList | undefined;
  private overrideList: OverrideEntry[] = [];
  private blockList: BlockEntry[] = [];

  /** Takes what the store holds now. Entries already ended are left out. */
  replace(version: string | undefined, overrides: readonly OverrideEntry[], blocks: readonly BlockEntry[], now: number): void {
    const byScope = new Map<string, ScopeOverrides>();
    const liveOverrides = overrides.filter((o) => o.until === undefined || o.until > now);
    for (const entry of liveOverrides) {
      let scope = byScope.get(entry.scope);
      if (scope === undefined) byScope.set(entry.scope, (scope = { all: undefined, byIdentity: new Map() }));
      if (entry.identity === undefined) scope.all = entry;
      else scope.byIdentity.set(entry.identity, entry);
    }
    const exact = new Map<string, BlockEntry>();
    const ranges: RangeBlock[] = [];
    const anyRange = new BlockList();
    const liveBlocks = blocks.filter((b) => b.until > now);
    for (const entry of liveBlocks) {
      const range = parseRange(entry.target);
      if (range === undefined) {
        exact.set(entry.target, entry);
        continue;
      }
      const list = new BlockList();
      list.addSubnet(range.address, range.bits, range.family);
      anyRange.addSubnet(range.address, range.bits, range.family);
      ranges.push({ entry, list });
    }
    this.overrides = byScope;
    this.exact = exact;
    this.ranges = ranges;
    this.anyRange = ranges.length > 0 ? anyRange : undefined;
    this.overrideList = liveOverrides;
    this.blockList = liveBlocks;
    this.version = version;
    this.active = liveOverrides.length > 0 || liveBlocks.length > 0;
  }

  /** The override a policy is decided with for an identity: its own, else the policy's; undefined when none is in force. */
  overrideOf(scope: string, identity: string, now: number): OverrideEntry | undefined {
    const overrides = this.overrides.get(scope);
    if (overrides === undefined) return undefined;
    const own = overrides.byIdentity.size > 0 ? overrides.byIdentity.get(identity) : undefined;
    if (own !== undefined && (own.until === undefined || own.until > now)) return own;
    const all = overrides.all;
    return all !== undefined && (all.until === undefined || all.until > now) ? all : undefined;
  }

  /** The block that holds an identity (`ip:…`, `user:…`, `key:…`, `id:…`): its own, or a range that holds its address. */
  blockOf(identity: string, now: number): BlockEntry | undefined {
    const own = this.exact.size > 0 ? this.exact.get(identity) : undefined;
    if (own !== undefined && own.until > now) return own;
    if (this.anyRange === undefined || !identity.startsWith('ip:')) return undefined;
    const address = identity.slice(3);
    const family = isIP(address);
    if (family === 0) return undefined;
    const kind = family === 4 ? 'ipv4' : 'ipv6';
    if (!this.anyRange.check(address, kind)) return undefined;
    for (const range of this.ranges) if (range.entry.until > now && range.list.check(address, kind)) return range.entry;
    return undefined;
  }

  /** The overrides in force. */
  get overridesInForce(): readonly OverrideEntry[] {
    return this.overrideList;
  }

  /** The blocks in force. */
  get blocksInForce(): readonly BlockEntry[] {
    return this.blockList;
  }
}

/** `ip:<address>/<bits>` as a subnet, or undefined for any other target. Targets were checked when written. */
export function parseRange(target: string): { address: string; bits: number; family: 'ipv4' | 'ipv6' } | undefined {
  if (!target.startsWith('ip:')) return undefined;
  const slash = target.lastIndexOf('/');
  if (slash < 0) return undefined;
  const address = target.slice(3, slash);
  const bits = Number(target.slice(slash + 1));
  const family = isIP(address);
  if (family === 0 || !Number.isInteger(bits)) return undefined;
  return { address, bits, family: family === 4 ? 'ipv4' : 'ipv6' };
}
