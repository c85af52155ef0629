-- slot.lua: a concurrency slot taken or renewed, by the rules slot-take.lua's header states, for the
-- scripts that take one (slot-take.lua, take-with-slot.lua). Needs `now` (clock.lua) and the locals
-- HUGE, floor and call.

-- Why a slot's numbers are refused (an error reply's text), or nil when they can be used.
local function slotProblem(limit, holder, life)
  if not limit or limit ~= floor(limit) or limit < 1 or limit > 10000 then
    return 'token-bucket: the limit must be an integer from 1 to 10000'
  end
  if #holder < 1 or #holder > 128 then return 'token-bucket: the holder must be 1 to 128 characters' end
  if not life or life ~= floor(life) or life < 1 or life > 3600000 then
    return 'token-bucket: leaseMs must be an integer from 1 to 3600000'
  end
  return nil
end

-- Takes (or renews) `holder`'s slot of `key`: 1 when held, else 0; the slots in flight after; when
-- refused, the ms until the earliest lease of another slot ends (0 when held). Or nil and the error
-- reply's text when the key holds another type (nothing written).
local function takeSlot(key, limit, holder, life)
  local field = 's:' .. holder
  local state = redis.pcall('HMGET', key, 'n', 'e', field)
  if state.err then return nil, 'token-bucket: unusable key: slots (' .. key .. '): ' .. state.err end
  local n, e = tonumber(state[1]) or 0, tonumber(state[2]) or HUGE
  local ends = now + life
  local scanned = false

  -- Keeps the key at least until `ends`.
  local function keep()
    local ttl = call('PTTL', key)
    if ttl < life then call('PEXPIRE', key, life) end
  end

  if state[3] then
    -- A renewal: the holder's slot is live or ended, and still counted in `n` either way. An end before
    -- `e` (a shorter lease, or Redis' clock stepped back) lowers it, else a lease ended would go unseen.
    if ends < e then
      call('HSET', key, field, ends, 'e', ends)
    else
      call('HSET', key, field, ends)
    end
    keep()
    return 1, n, 0
  end

  if n >= limit and e <= now then
    -- Every slot is in use by the count, and some lease has ended: drop the ended ones, count the rest.
    local all = call('HGETALL', key)
    n, e, scanned = 0, HUGE, true
    for i = 1, #all, 2 do
      local name = all[i]
      if name:sub(1, 2) == 's:' then
        local until_ = tonumber(all[i + 1])
        if until_ and until_ > now then
          n = n + 1
          if until_ < e then e = until_ end
        else
          call('HDEL', key, name)
        end
      end
    end
  end

  if n >= limit then
    -- Refused after a scan that dropped slots (a limit lower than the one they were taken under): the
    -- count and the bound are written back, else `n` would count the dropped ones until the next scan.
    if scanned then call('HSET', key, 'n', n, 'e', e) end
    return 0, n, e == HUGE and 0 or e - now
  end
  n = n + 1
  if ends < e then e = ends end
  call('HSET', key, field, ends, 'n', n, 'e', e)
  keep()
  return 1, n, 0
end
