-- take-with-slot.lua: one take of a decision's buckets and one concurrency slot, decided together
-- atomically: a route with rate policies and a @ConcurrencyLimit decided in the same phase, in one call.
-- The buckets are drained only when each has its cost and the slot is held; a slot refused leaves them
-- as they were.
--
-- KEYS   the decision's buckets (each once), then the identity's slots (slot-take.lua's hash).
--@argv per call: header
--@argv per bucket: capacity refillPerSecond cost
--@argv per bucket with a penalty: capacity refillPerSecond cost blockSeconds penaltyCost
--@argv per bucket above a floor: capacity refillPerSecond cost keep
--@argv per bucket with a penalty above a floor: capacity refillPerSecond cost blockSeconds penaltyCost keep
--@argv per slot: limit holder leaseMs
--@argv last, optional: now
-- ARGV   decide.lua's arguments of one take (its header's mode 0, or 3 above a floor) over the buckets;
--        then the slot's limit, holder and leaseMs (slot-take.lua); last, optionally, now in ms (tests).
-- Reply  an array: per bucket its code (code.lua), whose allowed bit says whether the buckets had their
--        cost (each of them, with no penalty running); with a penalty, per bucket the ms it still runs;
--        then the slot: 1 held, 0 refused, -1 not asked (the buckets refused); the slots in flight after
--        the call; when refused, the ms until the earliest lease of another slot ends. Refused numbers,
--        or a key that holds another type: an error reply, and nothing written.
--
-- Invariants
-- - The slot is asked for only when every bucket has its cost: a request refused by its rate takes no
--   slot. The buckets are drained only when the slot is held: a request refused for its slot takes no
--   token (and starts no penalty: the tokens were there). A rate refusal writes what decide.lua's would.
-- - Every argument is checked, and each key read, before the first write.
-- - The slot's rules are slot-take.lua's, and the buckets' decide.lua's (the same included parts; one
--   bucket without a penalty or a floor takes decide.lua's usual path, the others its general one).
--@include limits

local nargs = #ARGV
local count = #KEYS - 1
local h = tonumber(ARGV[1])
if count < 1 or not h or h ~= floor(h) or floor(h / 8) ~= count or (h % 4 ~= 0 and h % 4 ~= 3) then
  return redis.error_reply('token-bucket: a take with a slot has one take header that counts its buckets, then the slot key')
end
local penalised, aboveFloor = h % 8 >= 4, h % 4 == 3
local stride = penalised and 5 or 3
if aboveFloor then stride = stride + 1 end
local at = 2 + stride * count
if nargs ~= at + 2 and nargs ~= at + 3 then
  return redis.error_reply('token-bucket: a take with a slot has its buckets\' numbers, then limit, holder and leaseMs, and optionally now')
end
local now
if nargs == at + 3 then now = tonumber(ARGV[nargs]) end
--@include clock
if not (now == now and now ~= HUGE and now ~= -HUGE) then
  return redis.error_reply('token-bucket: now must be a finite number of ms')
end

--@include slot

local limit, holder, life = tonumber(ARGV[at]), ARGV[at + 1], tonumber(ARGV[at + 2])
local problem = slotProblem(limit, holder, life)
if problem then return redis.error_reply(problem) end

-- The usual call: one bucket without a penalty or a floor, as decide.lua's usual call reads and writes it
-- (the same parts), and its slot; the general path's closures and tables cost Redis more than this copy.
if count == 1 and not penalised and not aboveFloor then
  local cap, rate, cost = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
  local why
  --@include check-bucket
  --@include check-cost
  if not why then
    local key = KEYS[1]
    --@include one-read
    if usual then
      --@include one-refill
      local allowed = t >= cost
      local got, inFlight, wait = -1, 0, 0
      if allowed then
        got, inFlight, wait = takeSlot(KEYS[2], limit, holder, life)
        if not got then return redis.error_reply(inFlight) end
        if got == 1 then t = t - cost end
      end
      -- A slot refused: the bucket stays as it was (not even a repair is written, as for a peek).
      if got ~= 0 then
        --@include one-write
      end
      --@include code
      return { c, got, inFlight, wait }
    end
  end
  -- Anything else (a refused number among them) takes the general path, which says what is wrong.
end

--@include bucket
--@include settle
--@include numbers
--@include shown

local caps, rates, costs, blocks, leasts, keeps = {}, {}, {}, {}, {}, {}
local seen = {}
for i = 1, count do
  local key = KEYS[i]
  if seen[key] then return redis.error_reply(refused(i, i, 'the same key twice in one decision')) end
  seen[key] = true
  local cap, rate, cost, block, least, keep = numbers(i, i, 2 + stride * (i - 1), penalised, aboveFloor)
  if not cap then return redis.error_reply(rate) end
  caps[i], rates[i], costs[i], blocks[i], leasts[i], keeps[i] = cap, rate, cost, block, least, keep
end

local tokens, stamps, repaired, ends, held, rooms = {}, {}, {}, {}, {}, {}
local allowed = true
for i = 1, count do
  tokens[i], stamps[i], repaired[i], ends[i], held[i], rooms[i] = load(KEYS[i], caps[i], rates[i], blocks[i])
  if tokens[i] == nil then return redis.error_reply(unusable(i, i, stamps[i])) end
  if not (tokens[i] - keeps[i] >= costs[i]) or ends[i] then allowed = false end
end

local got, inFlight, wait = -1, 0, 0
if allowed then
  local slotKey = KEYS[count + 1]
  got, inFlight, wait = takeSlot(slotKey, limit, holder, life)
  if not got then return redis.error_reply(inFlight) end
end

local reply = {}
for i = 1, count do
  local running = ends[i]
  -- A slot refused: the buckets stay as they were (not even a repair is written, as for a peek).
  if got ~= 0 then
    tokens[i], ends[i] = settle(KEYS[i], 0, allowed, caps[i], rates[i], costs[i], blocks[i], leasts[i], tokens[i], stamps[i], repaired[i], ends[i], held[i], rooms[i])
  end
  reply[i] = code(allowed and tokens[i] or shown(tokens[i], costs[i], rates[i], running), allowed)
end
if penalised then
  for i = 1, count do reply[count + i] = penaltyLeft(ends[i]) end
end
local r = #reply
reply[r + 1], reply[r + 2], reply[r + 3] = got, inFlight, wait
return reply
