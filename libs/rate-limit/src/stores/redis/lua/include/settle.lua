-- settle.lua: a decision's writes to one bucket, after bucket.lua (`load` gives its tokens, stamp,
-- penalty, room). Included by the scripts that decide (decide.lua, reserve.lua, give-back.lua).
-- Writes what a decision did to one bucket (mode 0 take, 1 peek: nothing, 2 refund, up to its room, as
-- `load` gave it); answers its tokens and penalty end afterwards. The TTL is the longer of the idle TTL
-- 2 * B / R and the time it takes to fill from below 0, and never ends a running penalty early.
local nowText, lastTtl, lastTtlText
local function settle(key, mode, allowed, cap, rate, cost, block, least, t, ts, repaired, ends, held, room)
  if mode == 1 then return t, ends end
  local penalise = false
  if allowed then
    if mode == 2 then
      t = t + cost
      if t > room then t = room end
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
