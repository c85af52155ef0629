-- one-refill.lua: after one-read.lua, when `usual`: the bucket's tokens `t` and stamp `ts` brought to
-- now and capped at the includer's `cap` (a missing or unreadable bucket is full: `repaired` when it
-- existed); sets the new locals `ts`, `exists`, `held` (the key exists), `fresh` (written in this very
-- ms: a hot key, most likely with the TTL this call would set) and `repaired`. Needs `rate`.
local ts = tonumber(state[2])
local exists = state[1] ~= false or state[2] ~= false
local held = exists or state[3] ~= false
local fresh = ts == now
local repaired = false
if not t or not ts or t ~= t or ts ~= ts or t == HUGE or t == -HUGE or ts == HUGE or ts == -HUGE then
  repaired = exists
  t, ts = cap, now
else
  --@include refill
end
if t > cap then t = cap end
