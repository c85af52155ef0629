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

--@include slot

local limit, holder, life = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local problem = slotProblem(limit, holder, life)
if problem then return redis.error_reply(problem) end
local held, n, wait = takeSlot(KEYS[1], limit, holder, life)
if not held then return redis.error_reply(n) end
return { held, n, wait }
