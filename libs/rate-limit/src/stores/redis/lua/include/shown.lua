-- shown.lua: what a refused take is told of a bucket while a penalty runs, and the ms a penalty still
-- runs, for the scripts whose replies carry both (decide.lua, take-with-slot.lua). Needs `now` (clock.lua).

-- What a take is told while a penalty runs: never more than leaves it its cost when the penalty ends
-- (at its own refill), never below -MAX_CAPACITY.
local function shown(t, cost, rate, ends)
  if ends then
    local most = cost - (ends - now) * rate / 1000
    if not (most >= -MAX_CAPACITY) then most = -MAX_CAPACITY end
    if most < t then return most end
  end
  return t
end

local function penaltyLeft(ends)
  if ends then return floor(ends - now) end
  return 0
end
