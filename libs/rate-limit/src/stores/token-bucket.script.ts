import { createHash } from 'node:crypto';
import { FUTURE_TOLERANCE_MS, MAX_CAPACITY, MAX_WINDOW_SECONDS } from '../bucket/token-bucket.js';

/**
 * The token bucket in Lua: reads, refills, drains and writes every bucket of a decision in one atomic
 * script. Kept in a TypeScript module so that builds carry it without copying assets.
 *
 * KEYS[i]          bucket hash { tokens, ts } of policy i; a key may appear once (callers merge repeats)
 * ARGV[1]          now in ms, or '' to use Redis TIME (the only clock: app instances may be skewed)
 * ARGV[2]          'take' (drain all or none), 'peek' (write nothing) or 'refund' (give cost back)
 * ARGV[3i .. 3i+2] capacity, refill per second and cost of bucket i
 * Reply            { allowed (1 or 0), tokens of bucket 1, ..., tokens of bucket n }
 *                  tokens after the decision, as '%.17g' strings: Redis would truncate a Lua number
 *
 * Every argument is checked, and every value to be written computed, before the first write: a
 * refused argument is an error reply with nothing written, never a bucket drained without its TTL.
 * The bounds are `MAX_CAPACITY` and `MAX_WINDOW_SECONDS` of bucket/token-bucket.ts, so the PEXPIRE
 * argument is an integer of at most 2e15 ms, printed with '%d' (Redis would print a Lua number above
 * 1e17 as '1e+17', which PEXPIRE refuses).
 *
 * State it cannot trust is repaired, as `repair()` in bucket/token-bucket.ts does: non-finite tokens or
 * ts (nan, inf, garbage) count as a missing key (a full bucket), negative tokens as 0, a ts more than
 * `FUTURE_TOLERANCE_MS` ahead of now as now. A repaired bucket is written back even when the decision
 * is a refusal (not by 'peek'), and a refused bucket that has no TTL gets one: no key lives forever.
 */
export const TOKEN_BUCKET_LUA = `
local MAX_CAPACITY = ${MAX_CAPACITY}
local MAX_WINDOW_SECONDS = ${MAX_WINDOW_SECONDS}
local FUTURE_TOLERANCE_MS = ${FUTURE_TOLERANCE_MS}
local function finite(x)
  return x ~= nil and x == x and x ~= math.huge and x ~= -math.huge
end
local function integer(x)
  return finite(x) and x == math.floor(x)
end
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
if not finite(now) then return redis.error_reply('token-bucket: now must be a finite number of ms') end
local mode = ARGV[2]
if mode ~= 'take' and mode ~= 'peek' and mode ~= 'refund' then
  return redis.error_reply('token-bucket: mode must be take, peek or refund')
end
local n = #KEYS
local caps, rates, costs, ttls, seen = {}, {}, {}, {}, {}
for i = 1, n do
  local cap = tonumber(ARGV[3 * i])
  local rate = tonumber(ARGV[3 * i + 1])
  local cost = tonumber(ARGV[3 * i + 2])
  local where = 'token-bucket: bucket ' .. i .. ' (' .. KEYS[i] .. '): '
  if seen[KEYS[i]] then return redis.error_reply(where .. 'the same key twice in one call') end
  seen[KEYS[i]] = true
  if not integer(cap) or cap < 1 or cap > MAX_CAPACITY then
    return redis.error_reply(where .. 'capacity must be an integer from 1 to ' .. MAX_CAPACITY)
  end
  if not finite(rate) or rate <= 0 or not (cap / rate <= MAX_WINDOW_SECONDS) then
    return redis.error_reply(where .. 'refill must be > 0 with capacity / refill at most ' .. MAX_WINDOW_SECONDS .. ' s')
  end
  if not integer(cost) or cost < 0 then
    return redis.error_reply(where .. 'cost must be an integer >= 0')
  end
  caps[i], rates[i], costs[i] = cap, rate, cost
  ttls[i] = string.format('%d', math.ceil(2 * cap / rate * 1000))
end
local tokens, stamps, exists, repaired = {}, {}, {}, {}
local allowed = 1
for i = 1, n do
  local cap, rate = caps[i], rates[i]
  local state = redis.call('HMGET', KEYS[i], 'tokens', 'ts')
  local t = tonumber(state[1])
  local ts = tonumber(state[2])
  exists[i] = state[1] ~= false or state[2] ~= false
  repaired[i] = false
  if not finite(t) or not finite(ts) then
    repaired[i] = exists[i]
    t = cap
    ts = now
  else
    if t < 0 then
      t = 0
      repaired[i] = true
    end
    if ts > now + FUTURE_TOLERANCE_MS then
      ts = now
      repaired[i] = true
    end
    if now > ts then
      t = t + (now - ts) * rate / 1000
      ts = now
    end
  end
  if t > cap then t = cap end
  tokens[i], stamps[i] = t, ts
  if t < costs[i] then allowed = 0 end
end
if mode == 'refund' then allowed = 1 end
local reply = { allowed }
for i = 1, n do
  local t = tokens[i]
  if mode ~= 'peek' then
    if allowed == 1 then
      if mode == 'refund' then
        t = t + costs[i]
        if t > caps[i] then t = caps[i] end
      else
        t = t - costs[i]
      end
    end
    if allowed == 1 or repaired[i] then
      redis.call('HSET', KEYS[i], 'tokens', string.format('%.17g', t), 'ts', string.format('%.17g', stamps[i]))
      redis.call('PEXPIRE', KEYS[i], ttls[i])
    elseif exists[i] and redis.call('PTTL', KEYS[i]) == -1 then
      redis.call('PEXPIRE', KEYS[i], ttls[i])
    end
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
