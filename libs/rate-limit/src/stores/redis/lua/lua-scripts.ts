import { createHash } from 'node:crypto';
import {
  DECIDE_LUA,
  GIVE_BACK_LUA,
  LEASE_LUA,
  RESERVE_LUA,
  SLOT_GIVE_BACK_LUA,
  SLOT_TAKE_LUA,
  TAKE_WITH_SLOT_LUA,
} from './lua-sources.generated.js';

/**
 * The Redis scripts, one per operation, each written in a `.lua` file beside this one (its header says
 * its KEYS, ARGV, reply and invariants; shared parts are in include/), assembled into
 * lua-sources.generated.ts by scripts/lua-build.mjs. Each is defined on the client as an ioredis command
 * (EVALSHA, and the body once after a NOSCRIPT: a Redis that lost its script cache reloads it).
 */
export interface LuaScript {
  /** The `.lua` file's name without the extension. */
  readonly name: string;
  readonly lua: string;
  /** SHA1 of the body: what EVALSHA names. */
  readonly sha: string;
  /** The ioredis command name; carries the digest, so that a changed script never runs under an old name. */
  readonly command: string;
}

function script(name: string, lua: string): LuaScript {
  const sha = createHash('sha1').update(lua).digest('hex');
  const camel = name.replace(/-([a-z])/g, (_, letter: string) => letter.toUpperCase());
  return { name, lua, sha, command: `rateLimit_${camel}_${sha.slice(0, 12)}` };
}

/** Take, peek or refund: decisions over one or more buckets each (decide.lua). */
export const DECIDE_SCRIPT = script('decide', DECIDE_LUA);
/** Reservations of acquire(), in batches of one bucket each (reserve.lua). */
export const RESERVE_SCRIPT = script('reserve', RESERVE_LUA);
/** The give-back of a reservation (give-back.lua). */
export const GIVE_BACK_SCRIPT = script('give-back', GIVE_BACK_LUA);

/** A batch of tokens leased to one app instance, and what it gives back (lease.lua). */
export const LEASE_SCRIPT = script('lease', LEASE_LUA);

/** A concurrency slot taken or renewed (slot-take.lua). */
export const SLOT_TAKE_SCRIPT = script('slot-take', SLOT_TAKE_LUA);
/** A concurrency slot given back (slot-give-back.lua). */
export const SLOT_GIVE_BACK_SCRIPT = script('slot-give-back', SLOT_GIVE_BACK_LUA);
/** A take of buckets and a concurrency slot, decided together (take-with-slot.lua). */
export const TAKE_WITH_SLOT_SCRIPT = script('take-with-slot', TAKE_WITH_SLOT_LUA);

export const LUA_SCRIPTS: readonly LuaScript[] = [
  DECIDE_SCRIPT,
  RESERVE_SCRIPT,
  GIVE_BACK_SCRIPT,
  LEASE_SCRIPT,
  SLOT_TAKE_SCRIPT,
  SLOT_GIVE_BACK_SCRIPT,
  TAKE_WITH_SLOT_SCRIPT,
];
