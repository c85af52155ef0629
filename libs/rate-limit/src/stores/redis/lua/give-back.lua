-- give-back.lua: the give-back of a reservation (acquire() whose caller gave up, or a refund of it): a
-- refund that names the reservation it returns; several give-backs of one event-loop turn in one call
-- (coalescing), each decided on its own, in order.
--
-- KEYS   one bucket per give-back, in order.
--@argv per give-back: capacity refillPerSecond cost markTokens markMs
--@argv last, optional: now
-- ARGV   per give-back the bucket's capacity and refill per second, the cost to give back, and the mark
--        of the reservation as its reply told it: the tokens it left and the ms it was made at. Last,
--        optionally, now in ms (tests).
-- Reply  one give-back: one integer, the bucket's code after it (code.lua; always allowed). Several: an
--        array of them. A give-back whose numbers are refused, or whose key holds another type, is one
--        error string instead; alone, an error reply with that text.
--
-- Invariants
-- - A bucket at or above 0 (no turn to come) gets the cost back, capped at capacity, as a refund does.
-- - A bucket below 0 by reservations has turns already told: the cost comes back only when no
--   reservation came after the one returned (`last`), so that the last turn moves back by exactly it;
--   otherwise nothing is given back, since a token there would let a new caller share a moment that is
--   already taken, and a window would hold more than B + R*t.
--@include limits

local nargs = #ARGV
local now

local count = #KEYS
if count == 0 or (nargs ~= 5 * count and nargs ~= 5 * count + 1) then
  return redis.error_reply('token-bucket: a give-back has 5 arguments per key, and optionally now')
end
if nargs == 5 * count + 1 then now = tonumber(ARGV[nargs]) end
--@include clock
if not (now == now and now ~= HUGE and now ~= -HUGE) then
  return redis.error_reply('token-bucket: now must be a finite number of ms')
end

--@include bucket
--@include settle
--@include numbers

-- Whether a give-back finds the reservation it returns still the last one of its bucket: no reservation
-- came after it, so the count is what that reservation left (tokens `mt` at `mn`) plus the refill since,
-- within half a token (a later reservation took at least one).
local function last(t, rate, mt, mn)
  if not (mt and mn and mt == mt and mn == mn and mt ~= HUGE and mt ~= -HUGE and mn ~= HUGE and mn ~= -HUGE) then return false end
  local since = now - mn
  if since < 0 then since = 0 end
  return t >= mt + since * rate / 1000 - 0.5
end

local reply = {}
for k = 1, count do
  local a0 = 5 * (k - 1) + 1
  local key = KEYS[k]
  local cap, rate, cost = numbers(1, k, a0, false)
  local t, ts, repaired, ends, held, room
  if cap then
    t, ts, repaired, ends, held, room = load(key, cap, rate, 0)
    if t == nil then rate = unusable(1, k, ts) end
  end
  if not cap or t == nil then
    if count == 1 then return redis.error_reply(rate) end
    reply[k] = rate
  else
    local gives = not (t < 0 and reserved(key, rate) > 0 and not last(t, rate, tonumber(ARGV[a0 + 3]), tonumber(ARGV[a0 + 4])))
    t = settle(key, 2, gives, cap, rate, cost, 0, 0, t, ts, repaired, ends, held, room)
    reply[k] = code(t, true)
  end
end
if count == 1 then return reply[1] end
return reply
