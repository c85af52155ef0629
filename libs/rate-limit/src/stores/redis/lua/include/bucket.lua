-- bucket.lua: a bucket read, refilled, written and answered, for every decision of the general paths
-- (decide.lua past its fast path, reserve.lua, give-back.lua). Needs `now` set (clock.lua) before any
-- of these functions is called.
--
-- Penalties (a bucket with blockSeconds b > 0 that lacks its cost in a refused take, when no penalty
-- runs): its tokens become min(t, P - b*R) and its field `b` now + b*1000 (when the penalty ends), P
-- being the penalty cost (the policy's fixed cost, 1 when the cost is computed per request: never the
-- refused request's own cost, which a client may choose). Refilling, it has P again exactly b seconds
-- after the refusal. While a penalty runs, whoever started it, every take is refused, and a refusal
-- writes nothing (a penalty is never extended). Tokens from -(b*R) to 0 are legal state then.
--
-- Reservations (acquire(), reserve.lua) may take a bucket below 0; it then stores the longest wait of
-- any caller `w` (ms) and the depth `d` it allows (tokens): tokens down to -d are reservations, not
-- damage, for every caller whatever its own refill (a rolling deploy with other numbers).
--
-- State it cannot trust is repaired, as `repair()` in stores/token-bucket.ts does: non-finite tokens or
-- stamp (nan, inf, garbage) count as a missing key (a full bucket); tokens below -(b*R) and below the
-- reservations' depth as 0; a stamp more than FUTURE_TOLERANCE_MS ahead as now. A repaired bucket is
-- written back even when the decision is a refusal (not by a peek), and a refused bucket without a TTL
-- gets one: no key lives forever. No call shortens a key's TTL (PEXPIRE GT on a key that has one; a
-- plain PEXPIRE on a new key or one without, which GT would leave alone: Redis 7). The TTL, at most
-- 2e15 ms (the bounds), is printed with '%d': a Lua number that large may print with an exponent,
-- which PEXPIRE refuses.

-- Why bucket i (key k) of a decision is refused: the caller reads the text as a plain error.
local function refused(i, k, message)
  return 'token-bucket: bucket ' .. i .. ' (' .. KEYS[k] .. '): ' .. message
end

-- The refusal of a decision whose bucket i (key k) holds another type: the caller fails that decision
-- alone and does not count it as the store failing (the prefix is what it recognises).
local function unusable(i, k, err)
  return 'token-bucket: unusable key: bucket ' .. i .. ' (' .. KEYS[k] .. '): ' .. err
end

-- How far below 0 reservations may have taken a bucket, in tokens: the depth `d` the reservations
-- stored, or, written by an older version, what refills within the longest wait `w` (ms) at this
-- caller's refill, plus one; 0 without either; at most what refills within the longest window (at most
-- MAX_CAPACITY), as for penalties.
local function reserved(key, rate)
  local s = call('HMGET', key, 'w', 'd')
  local w, d = tonumber(s[1]), tonumber(s[2])
  local least = 0
  if w and w > 0 then least = w * rate / 1000 + 1 end
  if d and d > least then least = d end
  local most = MAX_WINDOW_SECONDS * rate
  if most > MAX_CAPACITY then most = MAX_CAPACITY end
  if not (least <= most) then return most end
  return least
end

-- A bucket as it stands now: tokens (refilled, capped), stamp, whether its state was repaired, when its
-- penalty ends (false: none runs), and whether the key exists at all (held); or nil and
-- Redis' error when the key holds another type (HMGET in redis.pcall: that decision fails, not the call).
local function load(key, cap, rate, block)
  local state = redis.pcall('HMGET', key, 'tokens', 'ts', 'b')
  if state.err then return nil, state.err end
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
    --@include refill
  end
  if t > cap then t = cap end
  return t, ts, repaired, ends, exists or state[3] ~= false
end

-- Writes what a decision did to one bucket (mode 0 take, 1 peek: nothing, 2 refund); answers its tokens
-- and penalty end afterwards. The TTL is the longer of the idle TTL 2 * B / R and the time it takes to
-- fill from below 0, and never ends a running penalty early.
local nowText, lastTtl, lastTtlText
local function settle(key, mode, allowed, cap, rate, cost, block, least, t, ts, repaired, ends, held)
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
  if not held or (call('PEXPIRE', key, lastTtlText, 'GT') == 0 and call('PTTL', key) == -1) then
    call('PEXPIRE', key, lastTtlText)
  end
  return t, ends
end

local function code(t, allowed)
  --@include code
  return c
end
