import { createHash } from 'node:crypto';

/**
 * The token bucket in Lua: reads, refills, drains and writes every bucket of a decision in one atomic
 * script. Kept in a TypeScript module so that builds carry it without copying assets.
 *
 * KEYS[i]          bucket hash { tokens, ts } of policy i
 * ARGV[1]          now in ms, or '' to use Redis TIME (the only clock: app instances may be skewed)
 * ARGV[2]          'take' (drain all or none), 'peek' (write nothing) or 'refund' (give cost back)
 * ARGV[3i .. 3i+2] capacity, refill per second and cost of bucket i
 * Reply            { allowed (1 or 0), tokens of bucket 1, ..., tokens of bucket n }
 *                  tokens after the decision, as '%.17g' strings: Redis would truncate a Lua number
 */
export const TOKEN_BUCKET_LUA = `
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local mode = ARGV[2]
local n = #KEYS
local tokens, stamps, caps, rates, costs = {}, {}, {}, {}, {}
local allowed = 1
for i = 1, n do
  local cap = tonumber(ARGV[3 * i])
  local rate = tonumber(ARGV[3 * i + 1])
  local cost = tonumber(ARGV[3 * i + 2])
  local state = redis.call('HMGET', KEYS[i], 'tokens', 'ts')
  local t = tonumber(state[1])
  local ts = tonumber(state[2])
  if t == nil or ts == nil then
    t = cap
    ts = now
  elseif now > ts then
    t = t + (now - ts) * rate / 1000
    ts = now
  end
  if t > cap then t = cap end
  tokens[i], stamps[i], caps[i], rates[i], costs[i] = t, ts, cap, rate, cost
  if t < cost then allowed = 0 end
end
if mode == 'refund' then allowed = 1 end
local reply = { allowed }
for i = 1, n do
  local t = tokens[i]
  if allowed == 1 and mode ~= 'peek' then
    if mode == 'refund' then
      t = t + costs[i]
      if t > caps[i] then t = caps[i] end
    else
      t = t - costs[i]
    end
    redis.call('HSET', KEYS[i], 'tokens', string.format('%.17g', t), 'ts', string.format('%.17g', stamps[i]))
    redis.call('PEXPIRE', KEYS[i], math.ceil(2 * caps[i] / rates[i] * 1000))
  end
  reply[i + 1] = string.format('%.17g', t)
end
return reply
`;

/** ioredis command name; carries the script's digest so that a changed script never runs under an old name. */
export const TOKEN_BUCKET_COMMAND = `rateLimitTokenBucket_${createHash('sha1')
  .update(TOKEN_BUCKET_LUA)
  .digest('hex')
  .slice(0, 12)}`;

export type TokenBucketMode = 'take' | 'peek' | 'refund';
