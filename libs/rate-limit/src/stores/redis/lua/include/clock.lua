-- clock.lua: `now` in ms by Redis' clock (TIME), unless the includer already set it from its last
-- argument (tests). Redis' is the only clock: app instances may be skewed against each other.
if not now then
  local clock = call('TIME')
  now = clock[1] * 1000 + floor(clock[2] / 1000)
end
