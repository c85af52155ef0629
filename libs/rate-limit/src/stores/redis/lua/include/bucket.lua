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

-- Leases (lease.lua): per holder a field `l:<holder>` = "<count>:<end ms>"; `o` the sum of the live
-- ones and `oe` the earliest end. A lease that ended no longer counts (its tokens were spent or are
-- lost). `load` leaves in these locals what it found of the last bucket it read: the tokens out on live
-- leases, the earliest end of one, and the fields of leases that ended.
local leased, leasedEnd, endedLeases = 0, false, {}

-- The count and end of a lease field, or nil when it is not one.
local function parseLease(value)
  local c, e = string.match(value, '^(%d+):(%d+)$')
  if not c then return nil end
  return tonumber(c), tonumber(e)
end

-- Counts the live leases of a bucket whose stored sum may include an ended one (now >= oe).
local function recount(key)
  leased, leasedEnd, endedLeases = 0, false, {}
  local all = call('HGETALL', key)
  for i = 1, #all, 2 do
    local f = all[i]
    if string.sub(f, 1, 2) == 'l:' then
      local c, e = parseLease(all[i + 1])
      if c and e > now then
        leased = leased + c
        if not leasedEnd or e < leasedEnd then leasedEnd = e end
      else
        endedLeases[#endedLeases + 1] = f
      end
    end
  end
end

-- A bucket as it stands now: tokens (refilled, capped), stamp, whether its state was repaired, when its
-- penalty ends (false: none runs), whether the key exists at all (held), and its room: the capacity
-- less the tokens out on live leases, which its tokens never exceed (refunds included); or nil and
-- Redis' error when the key holds another type (HMGET in redis.pcall: that decision fails, not the call).
local function load(key, cap, rate, block)
  local state = redis.pcall('HMGET', key, 'tokens', 'ts', 'b', 'o', 'oe')
  if state.err then return nil, state.err end
  leased, leasedEnd, endedLeases = 0, false, {}
  if state[4] then
    local o, oe = tonumber(state[4]), tonumber(state[5])
    if o and oe and now < oe then
      leased, leasedEnd = o, oe
    else
      recount(key)
    end
  end
  local room = cap - leased
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
  if t > room then t = room end
  return t, ts, repaired, ends, exists or state[3] ~= false, room
end

local function code(t, allowed)
  --@include code
  return c
end
