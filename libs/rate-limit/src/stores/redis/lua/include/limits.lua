-- limits.lua: the first lines of every script. The bounds are MAX_CAPACITY, MAX_WINDOW_SECONDS and
-- FUTURE_TOLERANCE_MS of stores/token-bucket.ts (a test reads both and compares them); the library
-- functions every script uses, as locals (a local is cheaper to reach than a global's table).
local MAX_CAPACITY = 1e12
local MAX_WINDOW_SECONDS = 1e12
local FUTURE_TOLERANCE_MS = 1000
local HUGE = math.huge
local floor, ceil, frexp, ldexp, format = math.floor, math.ceil, math.frexp, math.ldexp, string.format
local call = redis.call
