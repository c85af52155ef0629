-- reserve.lua: reservations (acquire()): each takes its cost now when its turn comes within its
-- longest wait, the bucket going below 0 if it must, and is told when its turn is; batches of
-- reservations of one bucket each, several batches of one event-loop turn in one call (coalescing),
-- each decided on its own, in order.
--
-- KEYS   one bucket per batch, batch after batch.
--@argv per batch: count capacity refillPerSecond longestWaitMs
--@argv per reservation: cost maxWaitMs
--@argv last, optional: now
-- ARGV   per batch the number n of its reservations, the bucket's capacity and refill per second, the
--        longest wait any call may have (ms: the depth below 0 it may take the bucket to), then per
--        reservation its cost and its call's longest wait (ms). Last, optionally, now in ms (tests).
-- Reply  an array, batch after batch: per reservation the bucket's code after it (code.lua; allowed:
--        its turn comes within its wait) and the wait in ms until its turn (also when refused: the wait
--        it would have had), then once now (ms, the clock they were decided by: a turn is now + its
--        wait by Redis' clock). A batch whose numbers are refused, or whose key holds another type, is
--        one error string instead; alone, an error reply with that text.
--
-- Invariants
-- - The bucket is read and refilled once per batch, as for a take. A reservation's wait is the time
--   until the bucket holds its cost, ceil((cost - t) / R * 1000) ms (0 when it has it now), and at
--   least until a running penalty ends.
-- - Within its longest wait the cost is taken (the tokens may go below 0): every later caller, take or
--   reservation, finds the reserved tokens gone, so turns are FIFO by arrival and grants never exceed
--   B + R*t. Beyond it nothing is taken (a repair aside).
-- - A bucket taken below 0 stores the longest wait of any caller `w` (ms) and the depth `d` it allows at
--   the caller's refill, w * R / 1000 + 1 tokens, each kept at the largest seen: tokens down to -d are
--   then reservations, not damage, for every caller whatever its refill (bucket.lua).
--@include limits

local nargs = #ARGV
local now

local at, batches = 1, 0
while at < nargs do
  local n = tonumber(ARGV[at])
  if not n or n ~= floor(n) or n < 1 then
    return redis.error_reply('token-bucket: argument ' .. at .. ' must be a number of reservations')
  end
  at = at + 4 + 2 * n
  batches = batches + 1
end
if at < nargs or at > nargs + 1 or batches ~= #KEYS or batches == 0 then
  return redis.error_reply('token-bucket: the reservation counts do not match the keys and arguments')
end
if at == nargs then now = tonumber(ARGV[nargs]) end
--@include clock
if not (now == now and now ~= HUGE and now ~= -HUGE) then
  return redis.error_reply('token-bucket: now must be a finite number of ms')
end

--@include bucket
--@include settle

-- The numbers of a batch of n reservations of one bucket (key k, arguments from a): capacity, refill,
-- the longest wait any call may have (ms), the costs and the calls' longest waits; or nil and why they
-- are refused.
local function reserveNumbers(k, a, n)
  local cap, rate = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  local why
  --@include check-bucket
  if why then return nil, refused(1, k, why) end
  local bound = tonumber(ARGV[a + 2])
  if not bound or not (bound >= 0) or bound > MAX_WINDOW_SECONDS * 1000 or not (bound * rate / 1000 <= MAX_CAPACITY) then
    return nil, refused(1, k, 'the longest wait must be from 0 to ' .. MAX_WINDOW_SECONDS * 1000 .. ' ms, with its refill at most ' .. MAX_CAPACITY .. ' tokens')
  end
  local costs, mosts = {}, {}
  for j = 1, n do
    local cost, most = tonumber(ARGV[a + 1 + 2 * j]), tonumber(ARGV[a + 2 + 2 * j])
    --@include check-cost
    if why then return nil, refused(1, k, why) end
    if not most or not (most >= 0) or most > bound then
      return nil, refused(1, k, 'maxWaitMs must be from 0 to the longest wait ' .. bound)
    end
    costs[j], mosts[j] = cost, most
  end
  return cap, rate, bound, costs, mosts
end

local reply, r = {}, 0
at = 1
for k = 1, batches do
  local n = tonumber(ARGV[at])
  local a0 = at + 1
  at = at + 4 + 2 * n
  local key = KEYS[k]
  local cap, rate, bound, costs, mosts = reserveNumbers(k, a0, n)
  local t, ts, repaired, ends, held, room
  if cap then
    t, ts, repaired, ends, held, room = load(key, cap, rate, 0)
    if t == nil then rate = unusable(1, k, ts) end
  end
  if not cap or t == nil then
    if batches == 1 then return redis.error_reply(rate) end
    r = r + 1
    reply[r] = rate
  else
    local any = false
    for j = 1, n do
      local cost = costs[j]
      local wait = 0
      if t < cost then wait = ceil((cost - t) / rate * 1000) end
      if ends and ends - now > wait then wait = ceil(ends - now) end
      local allowed = wait <= mosts[j]
      if allowed then
        t = t - cost
        any = true
      end
      r = r + 1
      reply[r] = code(t, allowed)
      r = r + 1
      reply[r] = wait
    end
    settle(key, 0, any, cap, rate, 0, 0, 0, t, ts, repaired, ends, held, room)
    if any and t < 0 then
      -- What tells these reservations from damage, for every caller: the longest wait (ms, read by older
      -- versions) and the depth it allows at this refill (tokens), each kept at the largest seen.
      local depth = bound * rate / 1000 + 1
      local s = call('HMGET', key, 'w', 'd')
      local w, d = tonumber(s[1]), tonumber(s[2])
      if not (w and w >= bound) then
        if not (d and d >= depth) then call('HSET', key, 'w', bound, 'd', depth) else call('HSET', key, 'w', bound) end
      elseif not (d and d >= depth) then
        call('HSET', key, 'd', depth)
      end
    end
    r = r + 1
    reply[r] = now
  end
end
return reply
