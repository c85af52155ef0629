import { createHash } from 'node:crypto';
import { FUTURE_TOLERANCE_MS, MAX_CAPACITY, MAX_WINDOW_SECONDS } from '../bucket/token-bucket.js';

/**
 * The token bucket in Lua: reads, refills, drains and writes every bucket of a decision in one atomic
 * script. Kept in a TypeScript module so that builds carry it without copying assets.
 *
 * KEYS[i]          bucket hash { tokens, ts, b? } of policy i; a key may appear once (callers merge repeats)
 * ARGV[1]          now in ms, or '' to use Redis TIME (the only clock: app instances may be skewed)
 * ARGV[2]          'take' (drain all or none), 'peek' (write nothing) or 'refund' (give cost back);
 *                  with a '+b' suffix ('take+b', ...) when a bucket of the call has a penalty
 * ARGV[3i .. 3i+2] capacity, refill per second and cost of bucket i (3 per bucket, no '+b'), or
 * ARGV[4i-1 .. 4i+2] capacity, refill per second, cost and blockSeconds of bucket i ('+b' modes)
 * Reply            { allowed (1 or 0), tokens of bucket 1, ..., tokens of bucket n }
 *                  tokens after the decision, as '%.17g' strings: Redis would truncate a Lua number;
 *                  '+b' modes append, per bucket, the ms its penalty still runs after now (0: none)
 *
 * Penalties ('take+b'): a bucket with blockSeconds b > 0 that lacks its cost in a refused take, and is
 * not penalised already (no field `b` > now), gets tokens min(t, cost - b*R) and `b` = now + b*1000
 * (when its penalty ends): refilling, it has its cost again exactly b seconds after the refusal. A
 * refusal during a penalty writes nothing (a penalty is never extended). Its TTL is the longer of the
 * idle TTL and the time it takes to fill from its (negative) tokens. Tokens from -(b*R) to 0 are legal
 * state then; 'peek+b' and 'refund+b' only need b for that.
 *
 * Every argument is checked, and every value to be written computed, before the first write: a
 * refused argument is an error reply with nothing written, never a bucket drained without its TTL.
 * The bounds are `MAX_CAPACITY` and `MAX_WINDOW_SECONDS` of bucket/token-bucket.ts, so the PEXPIRE
 * argument is an integer of at most 2e15 ms, printed with '%d' (Redis would print a Lua number above
 * 1e17 as '1e+17', which PEXPIRE refuses).
 *
 * State it cannot trust is repaired, as `repair()` in bucket/token-bucket.ts does: non-finite tokens or
 * ts (nan, inf, garbage) count as a missing key (a full bucket), tokens below -(b*R) (b: blockSeconds of
 * the call, 0 without a penalty) as 0, a ts more than
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
local stride = 3
if mode == 'take+b' or mode == 'peek+b' or mode == 'refund+b' then
  stride = 4
  mode = string.sub(mode, 1, -3)
elseif mode ~= 'take' and mode ~= 'peek' and mode ~= 'refund' then
  return redis.error_reply('token-bucket: mode must be take, peek or refund, with +b for penalties')
end
local n = #KEYS
if #ARGV ~= 2 + stride * n then
  return redis.error_reply('token-bucket: expected ' .. stride .. ' arguments per key')
end
local caps, rates, costs, blocks, ttls, seen = {}, {}, {}, {}, {}, {}
for i = 1, n do
  local at = stride * (i - 1) + 3
  local cap = tonumber(ARGV[at])
  local rate = tonumber(ARGV[at + 1])
  local cost = tonumber(ARGV[at + 2])
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
  local block = 0
  if stride == 4 then
    block = tonumber(ARGV[at + 3])
    if not finite(block) or block < 0 or block > MAX_WINDOW_SECONDS or not (block * rate <= MAX_CAPACITY) then
      return redis.error_reply(where .. 'blockSeconds must be from 0 to ' .. MAX_WINDOW_SECONDS .. ' with blockSeconds * refill at most ' .. MAX_CAPACITY)
    end
  end
  caps[i], rates[i], costs[i], blocks[i] = cap, rate, cost, block
  ttls[i] = math.ceil(2 * cap / rate * 1000)
end
local tokens, stamps, exists, repaired, ends = {}, {}, {}, {}, {}
local allowed = 1
for i = 1, n do
  local cap, rate = caps[i], rates[i]
  local state
  if stride == 4 then
    state = redis.call('HMGET', KEYS[i], 'tokens', 'ts', 'b')
    local e = tonumber(state[3])
    if finite(e) and e > now then ends[i] = e else ends[i] = false end
  else
    state = redis.call('HMGET', KEYS[i], 'tokens', 'ts')
  end
  local t = tonumber(state[1])
  local ts = tonumber(state[2])
  exists[i] = state[1] ~= false or state[2] ~= false
  repaired[i] = false
  if not finite(t) or not finite(ts) then
    repaired[i] = exists[i]
    t = cap
    ts = now
  else
    if t < 0 and t < -(blocks[i] * rate) then
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
    local ttl = ttls[i]
    local penalise = false
    if allowed == 1 then
      if mode == 'refund' then
        t = t + costs[i]
        if t > caps[i] then t = caps[i] end
      else
        t = t - costs[i]
      end
    elseif blocks[i] > 0 and t < costs[i] and not ends[i] then
      penalise = true
      local floor = costs[i] - blocks[i] * rates[i]
      if floor < t then t = floor end
      ends[i] = now + blocks[i] * 1000
    end
    if t < 0 then
      local fill = math.ceil((caps[i] - t) / rates[i] * 1000)
      if fill > ttl then ttl = fill end
    end
    ttl = string.format('%d', ttl)
    if penalise then
      redis.call('HSET', KEYS[i], 'tokens', string.format('%.17g', t), 'ts', string.format('%.17g', stamps[i]), 'b', string.format('%.17g', ends[i]))
      redis.call('PEXPIRE', KEYS[i], ttl)
    elseif allowed == 1 or repaired[i] then
      redis.call('HSET', KEYS[i], 'tokens', string.format('%.17g', t), 'ts', string.format('%.17g', stamps[i]))
      redis.call('PEXPIRE', KEYS[i], ttl)
    elseif exists[i] and redis.call('PTTL', KEYS[i]) == -1 then
      redis.call('PEXPIRE', KEYS[i], ttl)
    end
  end
  reply[i + 1] = string.format('%.17g', t)
end
if stride == 4 then
  for i = 1, n do
    if ends[i] then reply[n + 1 + i] = string.format('%.17g', ends[i] - now) else reply[n + 1 + i] = '0' end
  end
end
return reply
`;

/** ioredis command name; carries the script's digest so that a changed script never runs under an old name. */
export const TOKEN_BUCKET_COMMAND = `rateLimitTokenBucket_${createHash('sha1')
  .update(TOKEN_BUCKET_LUA)
  .digest('hex')
  .slice(0, 12)}`;

export type TokenBucketMode = 'take' | 'peek' | 'refund';
