/**
 * The token-bucket script's general path, after the prelude and the usual call's fast path (token-bucket.script.ts,
 * whose header describes the arguments and the reply; their locals are in scope): the call's structure checked, then
 * each decision in order, over any number of buckets, with penalties, refunds, peeks and reservations.
 *
 * Penalties: a bucket with blockSeconds b > 0 that lacks its cost in a refused take, and is not penalised already
 * (no field `b` > now), gets tokens min(t, P - b*R) and `b` = now + b*1000 (when its penalty ends), P being the
 * penalty cost (the policy's fixed cost, 1 when the cost is computed per request: never the refused request's own
 * cost, which a client may choose): refilling, it has P again exactly b seconds after the refusal. A refusal during
 * a penalty writes nothing (a penalty is never extended). Its TTL is the longer of the idle TTL and the time it
 * takes to fill from its (negative) tokens. Tokens from -(b*R) to 0 are legal state then.
 *
 * Callers with other numbers (routes sharing a name, a rolling deploy): every call reads `b`. While a penalty runs,
 * whoever started it, every take is refused (a refund is not), its tokens are kept (down to -min(MAX_CAPACITY,
 * MAX_WINDOW_SECONDS * R), what refills within the longest window) and the reply carries at most cost - (b - now) *
 * R / 1000 tokens, so that the caller's Retry-After is the penalty's remaining time (the usual call takes the
 * general path then, and still gets one integer). No call shortens a key's TTL (PEXPIRE GT on an existing key; a
 * plain PEXPIRE on a new key or one without a TTL, which GT would leave alone: Redis 7), and a key written while a
 * penalty runs lives until its end.
 *
 * Every argument of a decision is checked, and every value to be written computed, before its first write: a refused
 * argument writes nothing for that decision (an error reply when it is alone). The bounds are `MAX_CAPACITY` and
 * `MAX_WINDOW_SECONDS` of stores/token-bucket.ts, so the PEXPIRE argument is an integer of at most 2e15 ms, printed
 * with '%d' (a Lua number that large may be printed with an exponent, which PEXPIRE refuses). A call whose headers
 * do not match its keys and arguments is refused whole before anything is written.
 *
 * Reservations (header 11, acquire()): the bucket is read and refilled as for a take; the wait is the time until it
 * holds the cost, ceil((cost - t) / R * 1000) ms (0 when it has it), and at least until a running penalty ends.
 * Within the call's longest wait, the cost is taken (the tokens may go below 0: every later caller, take or
 * reservation, finds the reserved tokens gone, so turns are FIFO by arrival here and grants never exceed B + R·t),
 * and the bucket stores `w`, the longest wait of any caller (kept at the largest seen): tokens down to -(w * R /
 * 1000 + 1) are then reservations, not damage. Beyond the call's longest wait nothing is written (a repair aside). A
 * reservation given back is a refund. Tokens below 0 never take the usual call's fast path.
 *
 * State it cannot trust is repaired, as `repair()` in stores/token-bucket.ts does: non-finite tokens or ts (nan,
 * inf, garbage) count as a missing key (a full bucket), tokens below -(b*R) (b: blockSeconds of the call, 0 without
 * a penalty) and below the reservations' bound (above) as 0, a ts more than `FUTURE_TOLERANCE_MS` ahead of now as
 * now. A repaired bucket is written back even when the decision is a refusal (not by peek), and a refused bucket
 * that has no TTL gets one: no key lives forever.
 */
export const GENERAL_PATH_LUA = `-- The structure first: headers that match the keys and arguments, or nothing is written. A header
-- is never the last argument (its buckets follow it), so a last argument left over is now.
local at, keys, decisions = 1, 0, 0
while at < nargs do
  local h = tonumber(ARGV[at])
  if not h or h ~= floor(h) or h < 8 or (h % 4 == 3 and h ~= 11) then
    return redis.error_reply('token-bucket: argument ' .. at .. ' must be a decision header')
  end
  local n = floor(h / 8)
  if h == 11 or h % 8 >= 4 then at = at + 1 + 5 * n else at = at + 1 + 3 * n end
  keys = keys + n
  decisions = decisions + 1
end
if at < nargs or at > nargs + 1 or keys ~= #KEYS or decisions == 0 then
  return redis.error_reply('token-bucket: the decision headers do not match the keys and arguments')
end
if at == nargs then now = tonumber(ARGV[nargs]) else now = nil end
if not now then
  local t = call('TIME')
  now = t[1] * 1000 + floor(t[2] / 1000)
end
if not (now == now and now ~= HUGE and now ~= -HUGE) then
  return redis.error_reply('token-bucket: now must be a finite number of ms')
end

local function refused(i, k, message)
  return 'token-bucket: bucket ' .. i .. ' (' .. KEYS[k] .. '): ' .. message
end

-- The numbers of bucket i (key k, arguments from a), or nil and why they are refused.
local function numbers(i, k, a, penalty)
  local cap, rate, cost = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  if not cap or cap ~= floor(cap) or cap < 1 or cap > MAX_CAPACITY then
    return nil, refused(i, k, 'capacity must be an integer from 1 to ' .. MAX_CAPACITY)
  end
  if not rate or not (rate > 0) or rate == HUGE or not (cap / rate <= MAX_WINDOW_SECONDS) then
    return nil, refused(i, k, 'refill must be > 0 with capacity / refill at most ' .. MAX_WINDOW_SECONDS .. ' s')
  end
  if not cost or cost ~= floor(cost) or cost < 0 or cost == HUGE then
    return nil, refused(i, k, 'cost must be an integer >= 0')
  end
  local block, least = 0, 0
  if penalty then
    block = tonumber(ARGV[a + 3])
    if not block or not (block >= 0) or block > MAX_WINDOW_SECONDS or not (block * rate <= MAX_CAPACITY) then
      return nil, refused(i, k, 'blockSeconds must be from 0 to ' .. MAX_WINDOW_SECONDS .. ' with blockSeconds * refill at most ' .. MAX_CAPACITY)
    end
    local pcost = tonumber(ARGV[a + 4])
    if not pcost or pcost ~= floor(pcost) or pcost < 0 or pcost == HUGE then
      return nil, refused(i, k, 'penalty cost must be an integer >= 0')
    end
    least = pcost - block * rate
  end
  return cap, rate, cost, block, least
end

-- How far below 0 reservations may have taken a bucket: what refills within the longest wait w (ms)
-- stored with it by acquire(), plus one token for rounding; 0 without one; at most what refills within
-- the longest window (at most MAX_CAPACITY), as for penalties.
local function reserved(key, rate)
  local w = tonumber(call('HGET', key, 'w'))
  if not w or not (w > 0) then return 0 end
  local most = MAX_WINDOW_SECONDS * rate
  if most > MAX_CAPACITY then most = MAX_CAPACITY end
  local least = w * rate / 1000 + 1
  if not (least <= most) then return most end
  return least
end

-- The numbers of reservation (key k, arguments from a): capacity, refill, cost, the longest wait of the
-- call and the longest wait any call may have (ms), or nil and why they are refused.
local function reserveNumbers(k, a)
  local cap, rate, cost = numbers(1, k, a, false)
  if not cap then return nil, rate end
  local most, bound = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  if not bound or not (bound >= 0) or bound > MAX_WINDOW_SECONDS * 1000 or not (bound * rate / 1000 <= MAX_CAPACITY) then
    return nil, refused(1, k, 'the longest wait must be from 0 to ' .. MAX_WINDOW_SECONDS * 1000 .. ' ms, with its refill at most ' .. MAX_CAPACITY .. ' tokens')
  end
  if not most or not (most >= 0) or most > bound then
    return nil, refused(1, k, 'maxWaitMs must be from 0 to the longest wait ' .. bound)
  end
  return cap, rate, cost, most, bound
end

-- A bucket as it stands now: tokens (refilled, capped), stamp, whether it has state, whether its
-- state was repaired, when its penalty ends (false: none runs; whoever started it), and whether the
-- key exists at all.
local function load(key, cap, rate, block)
  local state = call('HMGET', key, 'tokens', 'ts', 'b')
  local e = tonumber(state[3])
  local ends = e ~= nil and e == e and e ~= HUGE and e > now and e
  local t, ts = tonumber(state[1]), tonumber(state[2])
  local exists = state[1] ~= false or state[2] ~= false
  local repaired = false
  if not t or not ts or t ~= t or ts ~= ts or t == HUGE or t == -HUGE or ts == HUGE or ts == -HUGE then
    repaired = exists
    t, ts = cap, now
  else
    -- While a penalty runs, any caller keeps the tokens it left: down to what refills within the longest
    -- window at this caller's rate (at most MAX_CAPACITY), so that its TTL stays within bounds.
    local lowest = block * rate
    if ends then
      lowest = MAX_WINDOW_SECONDS * rate
      if lowest > MAX_CAPACITY then lowest = MAX_CAPACITY end
    end
    if t < 0 and t < -lowest and t < -reserved(key, rate) then
      t = 0
      repaired = true
    end
    if ts > now + FUTURE_TOLERANCE_MS then
      ts = now
      repaired = true
    end
    if now > ts then
      t = t + (now - ts) * rate / 1000
      ts = now
    end
  end
  if t > cap then t = cap end
  return t, ts, exists, repaired, ends, exists or state[3] ~= false
end

-- What a take is told while a penalty runs: never more than leaves it its cost when the penalty ends
-- (at its own refill), never below -MAX_CAPACITY.
local function shown(t, cost, rate, ends)
  if ends then
    local most = cost - (ends - now) * rate / 1000
    if not (most >= -MAX_CAPACITY) then most = -MAX_CAPACITY end
    if most < t then return most end
  end
  return t
end

-- Writes what the decision did to one bucket; answers its tokens and penalty end afterwards.
local nowText, lastTtl, lastTtlText
local function settle(key, mode, allowed, cap, rate, cost, block, least, t, ts, exists, repaired, ends, held)
  if mode == 1 then return t, ends end
  local penalise = false
  if allowed then
    if mode == 2 then
      t = t + cost
      if t > cap then t = cap end
    else
      t = t - cost
    end
  elseif block > 0 and t < cost and not ends then
    penalise = true
    if least < t then t = least end
    ends = now + block * 1000
  end
  local write = penalise or allowed or repaired
  if not write and not (held and call('PTTL', key) == -1) then return t, ends end
  local ttl = ceil(2 * cap / rate * 1000)
  if t < 0 then
    local fill = ceil((cap - t) / rate * 1000)
    if fill > ttl then ttl = fill end
  end
  -- Never gone while its penalty runs (one another caller started, or a stored end), within the bounds.
  if ends and ends - now > ttl then
    ttl = ceil(ends - now)
    if ttl > 2 * MAX_WINDOW_SECONDS * 1000 then ttl = 2 * MAX_WINDOW_SECONDS * 1000 end
  end
  -- Decisions of one call share now, and mostly their policy: each number is printed once per call.
  if ts == now then
    if nowText == nil then nowText = now % 1 == 0 and format('%d', now) end
    if nowText then ts = nowText end
  end
  if ttl ~= lastTtl then
    lastTtl, lastTtlText = ttl, format('%d', ttl)
  end
  if penalise then
    call('HSET', key, 'tokens', t, 'ts', ts, 'b', ends)
  elseif write then
    call('HSET', key, 'tokens', t, 'ts', ts)
  end
  -- Never shorter than the TTL the key has: a caller with other numbers may have set a longer one.
  if not held or (call('PEXPIRE', key, lastTtlText, 'GT') == 0 and call('PTTL', key) == -1) then
    call('PEXPIRE', key, lastTtlText)
  end
  return t, ends
end

local function code(t, allowed)
  local c
  if t % 1 == 0 then
    c = (t * 128 + 109) * 2
  else
    local _, e = frexp(t)
    if e < -60 then e = -60 end
    c = (floor(ldexp(t, 45 - e)) * 128 + e + 64) * 2
  end
  if allowed then return c + 1 end
  return c
end

local function penaltyLeft(ends)
  if ends then return floor(ends - now) end
  return 0
end

local reply, r = {}, 0
at = 1
local k = 1
for _ = 1, decisions do
  local h = tonumber(ARGV[at])
  local n, mode, penalty = floor(h / 8), h % 4, h % 8 >= 4
  local stride = (penalty or mode == 3) and 5 or 3
  local a0, k0 = at + 1, k
  at = at + 1 + stride * n
  k = k + n
  if mode == 3 then
    -- A reservation (acquire): the cost is taken now, the bucket may go below 0 by it, and the reply says
    -- when the tokens exist (the caller's turn); refused, and nothing taken, when that is more than its
    -- longest wait.
    local key = KEYS[k0]
    local cap, rate, cost, most, bound = reserveNumbers(k0, a0)
    if not cap then
      if decisions == 1 then return redis.error_reply(rate) end
      r = r + 1
      reply[r] = rate
    else
      local t, ts, exists, repaired, ends, held = load(key, cap, rate, 0)
      local wait = 0
      if t < cost then wait = ceil((cost - t) / rate * 1000) end
      if ends and ends - now > wait then wait = ceil(ends - now) end
      local allowed = wait <= most
      t = settle(key, 0, allowed, cap, rate, cost, 0, 0, t, ts, exists, repaired, ends, held)
      if allowed and t < 0 then
        -- The bound that tells these reservations from damage: the longest of the callers' longest waits.
        local w = tonumber(call('HGET', key, 'w'))
        if not (w and w >= bound) then call('HSET', key, 'w', bound) end
      end
      r = r + 1
      reply[r] = code(t, allowed)
      r = r + 1
      reply[r] = wait
      r = r + 1
      reply[r] = now
    end
  elseif n == 1 then
    -- One bucket: the same steps as below, in locals (no tables per decision).
    local key = KEYS[k0]
    local cap, rate, cost, block, least = numbers(1, k0, a0, penalty)
    if not cap then
      if decisions == 1 then return redis.error_reply(rate) end
      r = r + 1
      reply[r] = rate
    else
      local t, ts, exists, repaired, ends, held = load(key, cap, rate, block)
      local allowed, running = mode == 2 or (t >= cost and not ends), ends
      t, ends = settle(key, mode, allowed, cap, rate, cost, block, least, t, ts, exists, repaired, ends, held)
      r = r + 1
      reply[r] = code(allowed and t or shown(t, cost, rate, running), allowed)
      if penalty then
        r = r + 1
        reply[r] = penaltyLeft(ends)
      end
    end
  else
    local caps, rates, costs, blocks, leasts = {}, {}, {}, {}, {}
    local problem
    local seen = {}
    for i = 1, n do
      local key = KEYS[k0 + i - 1]
      if seen[key] then
        problem = refused(i, k0 + i - 1, 'the same key twice in one decision')
        break
      end
      seen[key] = true
      local cap, rate, cost, block, least = numbers(i, k0 + i - 1, a0 + stride * (i - 1), penalty)
      if not cap then
        problem = rate
        break
      end
      caps[i], rates[i], costs[i], blocks[i], leasts[i] = cap, rate, cost, block, least
    end
    if problem then
      if decisions == 1 then return redis.error_reply(problem) end
      r = r + 1
      reply[r] = problem
    else
      local tokens, stamps, exists, repaired, ends, held = {}, {}, {}, {}, {}, {}
      local allowed = true
      for i = 1, n do
        tokens[i], stamps[i], exists[i], repaired[i], ends[i], held[i] = load(KEYS[k0 + i - 1], caps[i], rates[i], blocks[i])
        if tokens[i] < costs[i] or ends[i] then allowed = false end
      end
      if mode == 2 then allowed = true end
      local running = {}
      for i = 1, n do
        running[i] = ends[i]
        tokens[i], ends[i] = settle(KEYS[k0 + i - 1], mode, allowed, caps[i], rates[i], costs[i], blocks[i], leasts[i], tokens[i], stamps[i], exists[i], repaired[i], ends[i], held[i])
        r = r + 1
        reply[r] = code(allowed and tokens[i] or shown(tokens[i], costs[i], rates[i], running[i]), allowed)
      end
      if penalty then
        for i = 1, n do
          r = r + 1
          reply[r] = penaltyLeft(ends[i])
        end
      end
    end
  end
end
-- The usual call that came here (its bucket is under a penalty another caller started): one integer, as ever.
if decisions == 1 and r == 1 then return reply[1] end
return reply
`;
