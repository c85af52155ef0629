/**
 * The reference token bucket: the cheapest correct script we know for one bucket, written for the
 * bench and used as the floor ours is measured against (a floor built from our own script would hide
 * what our script costs). Same state and semantics as ours: a hash `{tokens, ts}` per bucket, Redis
 * `TIME` as the only clock, refill at `rate` per second up to `capacity`, drain 1, an idle TTL of twice
 * the time to fill. No argument checks, no repair of foreign state, no penalties, one bucket per call.
 *
 * Lua numbers go to HSET as they are: Redis 7 turns a Lua number passed to `redis.call` into a string
 * with `%.17g`, so nothing is lost. A refusal writes nothing: the refilled state equals the stored one
 * plus elapsed time, and the key already has the TTL of its last write.
 *
 * KEYS[1] the bucket; ARGV[1] capacity; ARGV[2] refill per second.
 */
function referenceLua(reply: 'verdict' | 'remaining'): string {
  const allowedReply = reply === 'verdict' ? '1' : 'math.floor(tokens)';
  // 'remaining': -(ms until one token exists), at least 1, so that the reply alone can fill Retry-After.
  const deniedReply = reply === 'verdict' ? '0' : '-math.max(1, math.ceil((1 - tokens) * 1000 / rate))';
  return `
local cap = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local state = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(state[1])
local ts = tonumber(state[2])
if tokens == nil or ts == nil then
  tokens = cap
  ts = now
elseif now > ts then
  tokens = tokens + (now - ts) * rate / 1000
  if tokens > cap then tokens = cap end
  ts = now
end
if tokens < 1 then return ${deniedReply} end
tokens = tokens - 1
redis.call('HSET', KEYS[1], 'tokens', tokens, 'ts', ts)
redis.call('PEXPIRE', KEYS[1], math.ceil(2 * cap / rate * 1000))
return ${allowedReply}
`;
}

/** Reply: 1 allowed, 0 denied (the decisions table's floor). */
export const REFERENCE_LUA = referenceLua('verdict');

/**
 * Reply: the whole tokens left when allowed (>= 0); when denied, minus the ms until one token exists
 * (<= -1). Enough for the minimal guard to write every header ours writes, from one integer.
 */
export const REFERENCE_REMAINING_LUA = referenceLua('remaining');
