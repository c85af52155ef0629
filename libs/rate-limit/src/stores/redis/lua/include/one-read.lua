-- one-read.lua: the usual one-bucket call's read (decide.lua's, take-with-slot.lua's): the bucket of
-- the includer's local `key`, read once, into the new locals `state` (HMGET of tokens, ts, b, o), `t`
-- (its tokens, nil when unreadable) and `usual`: true when no penalty runs (set by a caller of this
-- bucket with other numbers), the tokens are not below 0 (reservations of acquire(), a penalty's
-- leftovers, or damage) and no tokens are out on leases (the room is less than the capacity); else the
-- includer's general path decides. A key of another type is the includer's error reply. Needs `now`.
local state = redis.pcall('HMGET', key, 'tokens', 'ts', 'b', 'o')
if state.err then return redis.error_reply('token-bucket: unusable key: bucket 1 (' .. key .. '): ' .. state.err) end
local stop = state[3] and tonumber(state[3])
local t = tonumber(state[1])
local usual = not (stop and stop > now and stop ~= HUGE) and not (t and t < 0) and not state[4]
