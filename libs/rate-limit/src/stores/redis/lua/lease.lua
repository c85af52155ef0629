-- lease.lua: a batch of a bucket's tokens leased to one app instance (a holder), to spend without a
-- call per decision; the same call gives back what the holder will not spend, keeps what it still
-- holds, and asks for more. One bucket per call.
--
-- KEYS   the bucket.
--@argv per call: capacity refillPerSecond holder kept returned want lifeMs
--@argv last, optional: now
-- ARGV   the bucket's capacity and refill per second; the holder's id (1 to 64 characters: one per app
--        instance); of the tokens its live lease holds, those it keeps (`kept`: still in its hands) and
--        those it gives back (`returned`); the tokens it asks for now (`want`, 0 to give back only); and
--        how long the lease lives (ms, 1 to 60,000). Last, optionally, now in ms (tests).
-- Reply  an array: the tokens granted now, the tokens of its lease that the holder keeps (at most
--        `kept`: fewer when its lease ended before this call, and none then), the bucket's code after
--        the call (code.lua; allowed when anything was granted), and the ms a running penalty still
--        runs (0: none). Refused numbers: an error reply, nothing written.
--
-- Invariants (docs/explanation/leases.md)
-- - Leased tokens leave the bucket in the call that grants them, atomically: what all holders and the
--   exact scripts admit together never exceeds what one exact bucket would.
-- - The bucket stores per holder its lease (`l:<holder>` = "<count>:<end ms>") and the sum of the live
--   leases (`o`, with `oe`, the earliest end). Every script refills a bucket only up to capacity - o:
--   tokens out on a lease count as if they were still in the bucket, so the refill they would have
--   lost to the cap is lost all the same, and no window admits more than B + R*t.
-- - A lease ends `lifeMs` after the call, by Redis' clock; the holder stops spending it earlier by its
--   own clock (it counts from before it sent the call). Ended leases no longer count in `o` (their
--   tokens are spent or lost: under-admission only, never more); a holder that died loses its tokens.
-- - The key lives at least as long as the longest lease: no lease outlives its bucket.
--@include limits

local nargs = #ARGV
local now

if #KEYS ~= 1 or (nargs ~= 7 and nargs ~= 8) then
  return redis.error_reply('token-bucket: a lease has one key and 7 arguments, and optionally now')
end
if nargs == 8 then now = tonumber(ARGV[8]) end
--@include clock
if not (now == now and now ~= HUGE and now ~= -HUGE) then
  return redis.error_reply('token-bucket: now must be a finite number of ms')
end

--@include bucket

local key = KEYS[1]
local cap, rate = tonumber(ARGV[1]), tonumber(ARGV[2])
local why
--@include check-bucket
if why then return redis.error_reply(refused(1, 1, why)) end
local holder = ARGV[3]
if #holder < 1 or #holder > 64 then return redis.error_reply(refused(1, 1, 'the holder must be 1 to 64 characters')) end
local kept, returned, want, life = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
for _, n in ipairs({ kept, returned, want }) do
  if not n or n ~= floor(n) or n < 0 or n > MAX_CAPACITY then
    return redis.error_reply(refused(1, 1, 'kept, returned and want must be integers from 0 to ' .. MAX_CAPACITY))
  end
end
if not life or life ~= floor(life) or life < 1 or life > 60000 then
  return redis.error_reply(refused(1, 1, 'lifeMs must be an integer from 1 to 60000'))
end

local t, ts, _, ends, held = load(key, cap, rate, 0)
if t == nil then return redis.error_reply(unusable(1, 1, ts)) end

-- This holder's lease, when it still lives: what it may keep and give back.
local field = 'l:' .. holder
local live = 0
local mine = call('HGET', key, field)
if mine then
  local c, e = parseLease(mine)
  if c and e > now then live = c end
end
local keep = kept
if keep > live then keep = live end
local back = returned
if back > live - keep then back = live - keep end
-- Out of the lease: what it keeps stays out; what it gives back returns to the bucket; the rest was spent.
local out = leased - live
t = t + back

local granted = 0
if not ends and t >= 1 and want > 0 then
  granted = floor(t)
  if granted > want then granted = want end
  t = t - granted
end

local count = keep + granted
local stamp = format('%d', now)
if count > 0 then
  local lease_end = now + life
  call('HSET', key, field, format('%d', count) .. ':' .. format('%d', lease_end))
  out = out + count
  if not leasedEnd or lease_end < leasedEnd then leasedEnd = lease_end end
elseif mine then
  call('HDEL', key, field)
end
for i = 1, #endedLeases do
  if endedLeases[i] ~= field then call('HDEL', key, endedLeases[i]) end
end
if out > 0 then
  call('HSET', key, 'tokens', t, 'ts', ts == now and stamp or ts, 'o', out, 'oe', format('%d', leasedEnd))
else
  call('HSET', key, 'tokens', t, 'ts', ts == now and stamp or ts)
  call('HDEL', key, 'o', 'oe')
end
-- Never shorter than the TTL the key has, and never before its longest lease ends.
local ttl = ceil(2 * cap / rate * 1000)
if t < 0 then
  local fill = ceil((cap - t) / rate * 1000)
  if fill > ttl then ttl = fill end
end
if ttl < life + 1000 then ttl = life + 1000 end
local ttlText = format('%d', ttl)
if not held or (call('PEXPIRE', key, ttlText, 'GT') == 0 and call('PTTL', key) == -1) then
  call('PEXPIRE', key, ttlText)
end
local penalty = 0
if ends then penalty = floor(ends - now) end
return { granted, keep, code(t, granted > 0), penalty }
