import { Redis } from 'ioredis';

/**
 * The floor of the concurrency step: the cheapest correct distributed in-flight cap that also lets the
 * slots of dead holders expire, written for the bench. One sorted set per identity, a member per holder
 * scored by the ms its lease ends (Redis' clock).
 *
 * Take (one EVALSHA): drop the ended leases (ZREMRANGEBYSCORE), count (ZCARD), add the holder (ZADD)
 * and keep the key for one lease (PEXPIRE: every other member ends sooner, so it never cuts one short).
 * Reply: the slots in flight, this one included, or minus those in flight when refused.
 * Give back (one command): ZREM of the holder (Redis deletes the key with its last member).
 */
export const FLOOR_TAKE_LUA = `
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local key, life = KEYS[1], tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
local n = redis.call('ZCARD', key)
if n >= tonumber(ARGV[1]) then return -n end
redis.call('ZADD', key, now + life, ARGV[2])
redis.call('PEXPIRE', key, life)
return n + 1
`;

/** The floor's two calls on one client. */
export class FloorSlots {
  private sha = '';

  constructor(private readonly client: Redis) {}

  async load(): Promise<void> {
    this.sha = (await this.client.script('LOAD', FLOOR_TAKE_LUA)) as string;
  }

  /** The slots in flight with this one when taken, or minus those in flight when refused. */
  async take(key: string, limit: number, holder: string, leaseMs: number): Promise<number> {
    return (await this.client.evalsha(this.sha, 1, key, limit, holder, leaseMs)) as number;
  }

  async giveBack(key: string, holder: string): Promise<void> {
    await this.client.zrem(key, holder);
  }
}
