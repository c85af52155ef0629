-- slot-take.lua: a concurrency slot (@ConcurrencyLimit, BucketService.takeSlot()): one request of an
-- identity in flight, held by its holder until it is given back (slot-give-back.lua) or its lease ends.
-- The same call renews a slot its holder still has. One slot per call.
--
-- KEYS   the identity's slots: a hash.
--@argv per call: limit holder leaseMs
--@argv last, optional: now
-- ARGV   the most slots in flight at once (1 to 10,000); the holder's id (1 to 128 characters: one per
--        request in flight); how long the slot is held without a renewal (ms, 1 to 3,600,000). Last,
--        optionally, now in ms (tests).
-- Reply  an array: 1 when the slot is held (taken or renewed), else 0; the slots in flight after the
--        call, this one included when held; when refused, the ms until the earliest lease of another
--        slot ends (0 when held): a bound, not a promise, since a slot given back frees sooner. An
--        unusable key (another type) or refused numbers: an error reply, nothing written.
--
-- Invariants
-- - The hash holds per slot `s:<holder>` = the ms its lease ends, `n` = the slots it holds and `e` = a
--   time no lease of them ends before. A take reads `n` and `e` only; it scans the slots, dropping
--   those whose lease ended, only when all `limit` are in use and `e` has passed: a call costs O(1)
--   while slots are given back in time, and O(limit) after a holder died.
-- - A slot is granted only while fewer than `limit` live slots are held: never more than `limit`
--   requests of one identity are in flight, whatever the number of app instances.
-- - The key lives as long as its longest lease (PEXPIRE, never shortened), so a key whose holders all
--   died is gone by itself.
-- Not limits.lua: a slot has none of a bucket's numbers.
local HUGE, floor, call = math.huge, math.floor, redis.call

local nargs = #ARGV
local now

if #KEYS ~= 1 or (nargs ~= 3 and nargs ~= 4) then
  return redis.error_reply('token-bucket: a slot take has one key and 3 arguments, and optionally now')
end
if nargs == 4 then now = tonumber(ARGV[4]) end
--@include clock
if not (now == now and now ~= HUGE and now ~= -HUGE) then
  return redis.error_reply('token-bucket: now must be a finite number of ms')
end

local key = KEYS[1]
local limit, holder, life = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
if not limit or limit ~= floor(limit) or limit < 1 or limit > 10000 then
  return redis.error_reply('token-bucket: the limit must be an integer from 1 to 10000')
end
if #holder < 1 or #holder > 128 then return redis.error_reply('token-bucket: the holder must be 1 to 128 characters') end
if not life or life ~= floor(life) or life < 1 or life > 3600000 then
  return redis.error_reply('token-bucket: leaseMs must be an integer from 1 to 3600000')
end

local field = 's:' .. holder
local state = redis.pcall('HMGET', key, 'n', 'e', field)
if state.err then return redis.error_reply('token-bucket: unusable key: slots (' .. key .. '): ' .. state.err) end
local n, e = tonumber(state[1]) or 0, tonumber(state[2]) or HUGE
local ends = now + life
local scanned = false

-- Keeps the key at least until `ends`.
local function keep()
  local ttl = call('PTTL', key)
  if ttl < life then call('PEXPIRE', key, life) end
end

if state[3] then
  -- A renewal: the holder's slot is live or ended, and still counted in `n` either way. An end before `e`
  -- (a shorter lease, or Redis' clock stepped back) lowers it, else a lease ended would go unseen.
  if ends < e then
    call('HSET', key, field, ends, 'e', ends)
  else
    call('HSET', key, field, ends)
  end
  keep()
  return { 1, n, 0 }
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
  -- Refused after a scan that dropped slots (a limit lower than the one they were taken under): the count
  -- and the bound are written back, else `n` would count the dropped ones until the next scan.
  if scanned then call('HSET', key, 'n', n, 'e', e) end
  return { 0, n, e == HUGE and 0 or e - now }
end
n = n + 1
if ends < e then e = ends end
call('HSET', key, field, ends, 'n', n, 'e', e)
keep()
return { 1, n, 0 }
