-- decide.lua: take, peek, refund or take above a floor: each decision over its buckets, all or none, atomically; several
-- independent decisions of one event-loop turn in one call (coalescing), each decided on its own, in
-- order, as if it had been sent alone.
--
-- KEYS   the buckets of every decision, decision after decision. A key appears at most once per
--        decision (callers merge repeats), any number of times across decisions.
--@argv per decision: header
--@argv per bucket: capacity refillPerSecond cost
--@argv per bucket with a penalty: capacity refillPerSecond cost blockSeconds penaltyCost
--@argv per bucket above a floor: capacity refillPerSecond cost keep
--@argv per bucket with a penalty above a floor: capacity refillPerSecond cost blockSeconds penaltyCost keep
--@argv last, optional: now
-- ARGV   per decision its header, n * 8 + (4 when a bucket of it has a penalty) + mode (0 take: drain
--        all or none; 1 peek: write nothing; 2 refund: give the cost back; 3 take above a floor: a take
--        that must leave each bucket at least its `keep` tokens, a priority's reserve), n its number of
--        buckets; then per bucket its numbers, with a penalty's two after a header with the 4 bit, and
--        `keep` last with mode 3. Last, optionally, now in ms (tests); without it Redis' TIME is the clock.
-- Reply  one decision over one bucket without a penalty (the usual call): one integer, the bucket's
--        code (code.lua). Otherwise an array, decision after decision: the code of each bucket, then,
--        with a penalty, per bucket the whole ms the penalty still runs after now (0: none). A decision
--        whose numbers are refused is one error string instead, and so is one whose key holds another
--        type ('token-bucket: unusable key: ...'); alone, an error reply with that text. A call whose
--        headers do not match its keys and arguments is refused whole, before anything is written.
--
-- Invariants
-- - A take drains every bucket of its decision or none; a take above a floor drains them only when
--   each keeps its `keep` tokens after its cost (tokens - keep >= cost), and never starts a penalty on
--   a bucket that had its cost (the floor is that caller's, not the bucket's); a peek writes nothing; a refund gives the cost
--   back, capped at capacity, except to a bucket below 0 by reservations (other callers' turns are set:
--   a token given back there would let a window hold more than B + R*t).
-- - Every argument of a decision is checked, and every value to write computed, before its first write:
--   a refused argument writes nothing for that decision.
-- - The tokens a reply carries are never more than the bucket holds. While a penalty runs (whoever
--   started it), a take is refused and told at most cost - (penalty left) * R tokens, so that its
--   Retry-After is the penalty's remaining time.
-- - No call shortens a key's TTL, every key written has one, and a key written while a penalty runs
--   lives until its end (bucket.lua).
--@include limits

local nargs = #ARGV
local now

-- The usual call: one take, peek or refund of one bucket without a penalty; one integer back. The same
-- arithmetic as load, settle and code of the general path below, written out for one bucket (Redis CPU
-- per decision is what the library's capacity comes down to, and the closures of the general path cost
-- more than this copy). The model test runs random sequences through both paths.
if #KEYS == 1 and (nargs == 4 or nargs == 5) then
  if nargs == 5 then now = tonumber(ARGV[5]) end
  --@include clock
  local h, cap, rate, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
  local why
  --@include check-bucket
  --@include check-cost
  if (h == 8 or h == 9 or h == 10) and not why and now == now and now ~= HUGE and now ~= -HUGE then
    local key = KEYS[1]
    --@include one-read
    if usual then
      --@include one-refill
      local allowed = h == 10 or t >= cost
      if h ~= 9 then
        if allowed then
          if h == 10 then
            t = t + cost
            if t > cap then t = cap end
          else
            t = t - cost
          end
        end
        --@include one-write
      end
      --@include code
      return c
    end
  end
  -- Anything else (a refused argument among them) takes the general path, which says what is wrong.
end

-- The general path. The structure first: headers that match the keys and arguments, or nothing is
-- written. A header is never the last argument (its buckets follow it), so a last one left over is now.
local at, keys, decisions = 1, 0, 0
while at < nargs do
  local h = tonumber(ARGV[at])
  if not h or h ~= floor(h) or h < 8 then
    return redis.error_reply('token-bucket: argument ' .. at .. ' must be a decision header')
  end
  local n = floor(h / 8)
  local stride = 3
  if h % 8 >= 4 then stride = 5 end
  if h % 4 == 3 then stride = stride + 1 end
  at = at + 1 + stride * n
  keys = keys + n
  decisions = decisions + 1
end
if at < nargs or at > nargs + 1 or keys ~= #KEYS or decisions == 0 then
  return redis.error_reply('token-bucket: the decision headers do not match the keys and arguments')
end
if at == nargs then now = tonumber(ARGV[nargs]) else now = nil end
--@include clock
if not (now == now and now ~= HUGE and now ~= -HUGE) then
  return redis.error_reply('token-bucket: now must be a finite number of ms')
end

--@include bucket
--@include settle
--@include numbers

--@include shown

local reply, r = {}, 0
at = 1
local k = 1
for _ = 1, decisions do
  local h = tonumber(ARGV[at])
  local n, mode, penalty = floor(h / 8), h % 4, h % 8 >= 4
  local a0, k0 = at + 1, k
  local stride = penalty and 5 or 3
  -- A take above a floor (mode 3) is a take (mode 0) whose buckets each carry `keep` last.
  local floored = mode == 3
  if floored then
    mode = 0
    stride = stride + 1
  end
  at = at + 1 + stride * n
  k = k + n
  if n == 1 then
    -- One bucket: the same steps as below, in locals (no tables per decision).
    local key = KEYS[k0]
    local cap, rate, cost, block, least, keep = numbers(1, k0, a0, penalty, floored)
    local t, ts, repaired, ends, held, room
    if cap then
      t, ts, repaired, ends, held, room = load(key, cap, rate, block)
      if t == nil then rate = unusable(1, k0, ts) end
    end
    if not cap or t == nil then
      if decisions == 1 then return redis.error_reply(rate) end
      r = r + 1
      reply[r] = rate
    else
      local allowed, running = mode == 2 or (t - keep >= cost and not ends), ends
      -- A refund gives nothing back to a bucket below 0 by reservations: other callers' turns are set.
      local gives = allowed and not (mode == 2 and t < 0 and reserved(key, rate) > 0)
      t, ends = settle(key, mode, gives, cap, rate, cost, mode == 2 and 0 or block, least, t, ts, repaired, ends, held, room)
      r = r + 1
      reply[r] = code(allowed and t or shown(t, cost, rate, running), allowed)
      if penalty then
        r = r + 1
        reply[r] = penaltyLeft(ends)
      end
    end
  else
    local caps, rates, costs, blocks, leasts, keeps = {}, {}, {}, {}, {}, {}
    local problem
    local seen = {}
    for i = 1, n do
      local key = KEYS[k0 + i - 1]
      if seen[key] then
        problem = refused(i, k0 + i - 1, 'the same key twice in one decision')
        break
      end
      seen[key] = true
      local cap, rate, cost, block, least, keep = numbers(i, k0 + i - 1, a0 + stride * (i - 1), penalty, floored)
      if not cap then
        problem = rate
        break
      end
      caps[i], rates[i], costs[i], blocks[i], leasts[i], keeps[i] = cap, rate, cost, block, least, keep
    end
    local tokens, stamps, repaired, ends, held, rooms = {}, {}, {}, {}, {}, {}
    if not problem then
      for i = 1, n do
        tokens[i], stamps[i], repaired[i], ends[i], held[i], rooms[i] = load(KEYS[k0 + i - 1], caps[i], rates[i], blocks[i])
        if tokens[i] == nil then
          problem = unusable(i, k0 + i - 1, stamps[i])
          break
        end
      end
    end
    if problem then
      if decisions == 1 then return redis.error_reply(problem) end
      r = r + 1
      reply[r] = problem
    else
      local allowed = true
      for i = 1, n do
        if not (tokens[i] - keeps[i] >= costs[i]) or ends[i] then allowed = false end
      end
      if mode == 2 then allowed = true end
      local running = {}
      for i = 1, n do
        running[i] = ends[i]
        local gives = allowed and not (mode == 2 and tokens[i] < 0 and reserved(KEYS[k0 + i - 1], rates[i]) > 0)
        tokens[i], ends[i] = settle(KEYS[k0 + i - 1], mode, gives, caps[i], rates[i], costs[i], mode == 2 and 0 or blocks[i], leasts[i], tokens[i], stamps[i], repaired[i], ends[i], held[i], rooms[i])
        r = r + 1
        reply[r] = code(allowed and tokens[i] or shown(tokens[i], costs[i], rates[i], running[i]), allowed)
      end
      if penalty then
        for i = 1, n do
          r = r + 1
          reply[r] = penaltyLeft(ends[i])
        end
      end
    end
  end
end
-- The usual call that came here (its bucket is under a penalty another caller started): one integer, as ever.
if decisions == 1 and r == 1 then return reply[1] end
return reply
