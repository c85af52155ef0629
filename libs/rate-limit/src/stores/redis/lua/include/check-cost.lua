-- check-cost.lua: whether a cost can be used, after check-bucket.lua. Reads the includer's local `cost`
-- (tonumber of the argument) and sets its local `why` when nothing was refused before and the cost is
-- not an integer >= 0.
if not why and (not cost or cost ~= floor(cost) or cost < 0 or cost == HUGE) then
  why = 'cost must be an integer >= 0'
end
