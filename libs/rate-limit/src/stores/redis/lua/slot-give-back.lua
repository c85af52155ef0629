-- slot-give-back.lua: a concurrency slot given back by its holder (the request finished, whatever way).
-- One slot per call.
--
-- KEYS   the identity's slots: a hash (slot-take.lua).
--@argv per call: holder
-- ARGV   the holder's id (1 to 128 characters).
-- Reply  an array: 1 when the holder's slot was there and is gone, 0 when it was not there (its lease
--        ended and another take dropped it, or the key was deleted); then the slots still held. An
--        unusable key (another type) or a refused holder: an error reply, nothing written.
--
-- Invariants
-- - Only the holder's own slot goes: a give-back never frees another request's slot, and a second
--   give-back of the same slot frees nothing.
-- - The last slot given back deletes the key: an identity with nothing in flight holds no memory.
local call = redis.call

if #KEYS ~= 1 or #ARGV ~= 1 then
  return redis.error_reply('token-bucket: a slot give-back has one key and 1 argument')
end
local key, holder = KEYS[1], ARGV[1]
if #holder < 1 or #holder > 128 then return redis.error_reply('token-bucket: the holder must be 1 to 128 characters') end

local field = 's:' .. holder
local state = redis.pcall('HMGET', key, 'n', field)
if state.err then return redis.error_reply('token-bucket: unusable key: slots (' .. key .. '): ' .. state.err) end
local n = tonumber(state[1]) or 0
if not state[2] then return { 0, n } end
n = n - 1
if n <= 0 then
  call('DEL', key)
  return { 1, 0 }
end
call('HDEL', key, field)
call('HSET', key, 'n', n)
return { 1, n }
