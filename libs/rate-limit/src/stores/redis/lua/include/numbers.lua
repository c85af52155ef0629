-- numbers.lua: the numbers of bucket i of a decision (key k, its arguments from position a): capacity,
-- refill per second, cost and, with `penalty`, blockSeconds and the penalty cost, and with `floored`
-- the tokens a take must leave (`keep`, from 0 to below the capacity); answers them with the lowest
-- tokens a penalty leaves (penalty cost - blockSeconds * refill; 0 without a penalty) and keep (0
-- without a floor), or nil and why they are refused (`refused` of bucket.lua).
local function numbers(i, k, a, penalty, floored)
  local cap, rate, cost = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local why
  --@include check-bucket
  --@include check-cost
  if why then return nil, refused(i, k, why) end
  local block, least = 0, 0
  if penalty then
    block = tonumber(ARGV[a + 3])
    if not block or not (block >= 0) or block > MAX_WINDOW_SECONDS or not (block * rate <= MAX_CAPACITY) then
      return nil, refused(i, k, 'blockSeconds must be from 0 to ' .. MAX_WINDOW_SECONDS .. ' with blockSeconds * refill at most ' .. MAX_CAPACITY)
    end
    local pcost = tonumber(ARGV[a + 4])
    if not pcost or pcost ~= floor(pcost) or pcost < 0 or pcost == HUGE then
      return nil, refused(i, k, 'penalty cost must be an integer >= 0')
    end
    least = pcost - block * rate
  end
  local keep = 0
  if floored then
    keep = tonumber(ARGV[a + (penalty and 5 or 3)])
    if not keep or not (keep >= 0) or not (keep < cap) then
      return nil, refused(i, k, 'keep must be from 0 to below the capacity')
    end
  end
  return cap, rate, cost, block, least, keep
end
