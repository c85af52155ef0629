/**
 * The token-bucket script's general path, after the prelude and the usual call's fast path (token-bucket.script.ts,
 * whose header describes the arguments and the reply; their locals are in scope): the call's structure checked, then
 * each decision in order, over any number of buckets, with penalties, refunds, peeks and reservations.
 *
 * Penalties: a bucket with blockSeconds b > 0 that lacks its cost in a refused take, and is not penalised already
 * (no field `b` > now), gets tokens min(t, P - b*R) and `b` = now + b*1000 (when its penalty ends), P being the
 * penalty cost (the policy's fixed cost, 1 when the cost is computed per request: never the refused request's own
 * cost, which a client may choose): refilling, it has P again exactly b seconds after the refusal. A refusal during
 * a penalty writes nothing (a penalty is never extended). Its TTL is the longer of the idle TTL and the time it
 * takes to fill from its (negative) tokens. Tokens from -(b*R) to 0 are legal state then.
 *
 * Callers with other numbers (routes sharing a name, a rolling deploy): every call reads `b`. While a penalty runs,
 * whoever started it, every take is refused (a refund is not), its tokens are kept (down to -min(MAX_CAPACITY,
 * MAX_WINDOW_SECONDS * R), what refills within the longest window) and the reply carries at most cost - (b - now) *
 * R / 1000 tokens, so that the caller's Retry-After is the penalty's remaining time (the usual call takes the
 * general path then, and still gets one integer). No call shortens a key's TTL (PEXPIRE GT on an existing key; a
 * plain PEXPIRE on a new key or one without a TTL, which GT would leave alone: Redis 7), and a key written while a
 * penalty runs lives until its end.
 *
 * Every argument of a decision is checked, and every value to be written computed, before its first write: a refused
 * argument writes nothing for that decision (an error reply when it is alone). The bounds are `MAX_CAPACITY` and
 * `MAX_WINDOW_SECONDS` of stores/token-bucket.ts, so the PEXPIRE argument is an integer of at most 2e15 ms, printed
 * with '%d' (a Lua number that large may be printed with an exponent, which PEXPIRE refuses). A call whose headers
 * do not match its keys and arguments is refused whole before anything is written.
 *
 * Reservations (header n * 8 + 3, acquire(): n of one bucket, in order): the bucket is read and refilled once as
 * for a take; each one's wait is the time until it holds that cost, ceil((cost - t) / R * 1000) ms (0 when it has
 * it), and at least until a running penalty ends. Within the call's longest wait, the cost is taken (the tokens may
 * go below 0: every later caller, take or reservation, finds the reserved tokens gone, so turns are FIFO by arrival
 * here and grants never exceed B + R·t), and the bucket stores the longest wait of any caller `w` (ms) and the depth
 * `d` it allows at the caller's refill, w * R / 1000 + 1 tokens (each kept at the largest seen): tokens down to -d
 * are then reservations, not damage, for every caller whatever its own refill (a rolling deploy with other numbers).
 * Beyond the call's longest wait nothing is taken (a repair aside).
 *
 * Refunds into a bucket below 0 by reservations (it has a \`w\` or \`d\`): the turns already told stay where they are,
 * so a token given back there would let a new caller share a moment that is already taken, and a window would hold
 * more than B + R·t. A plain refund (mode 2) therefore gives nothing back to such a bucket. (Below 0 by a penalty
 * alone, a refund gives the cost back as ever: a penalty only ever holds a bucket lower than B + R·t would.) A
 * give-back (header 15) names
 * the reservation it returns by the tokens it left and the time it was made: when no reservation came after it
 * (`last`), its cost is given back and the last turn moves back by exactly that; otherwise nothing is. A bucket at
 * or above 0 (no turn to come) gets the cost back, capped at capacity, as ever.
 *
 * A key that holds another type (WRONGTYPE) fails its own decision (an error string, 'token-bucket: unusable key:
 * ...'), never the others of the call: HMGET is the first command on each key, and runs in redis.pcall.
 *
 * State it cannot trust is repaired, as `repair()` in stores/token-bucket.ts does: non-finite tokens or ts (nan,
 * inf, garbage) count as a missing key (a full bucket), tokens below -(b*R) (b: blockSeconds of the call, 0 without
 * a penalty) and below the reservations' bound (above) as 0, a ts more than `FUTURE_TOLERANCE_MS` ahead of now as
 * now. A repaired bucket is written back even when the decision is a refusal (not by peek), and a refused bucket
 * that has no TTL gets one: no key lives forever.
 */
export const GENERAL_PATH_LUA = `-- The structure first: headers that match the keys and arguments, or nothing is written. A header
-- is never the last argument (its buckets follow it), so a last argument left over is now.
local at, keys, decisions = 1, 0, 0
while at < nargs do
  local h = tonumber(ARGV[at])
  if not h or h ~= floor(h) or h < 8 or (h % 8 == 7 and h ~= 15) then
    return redis.error_reply('token-bucket: argument ' .. at .. ' must be a decision header')
  end
  local n = floor(h / 8)
  if h % 8 == 3 then
    -- n reservations of one bucket: capacity, refill, the longest wait, then a cost and a longest wait each.
    at = at + 4 + 2 * n
    keys = keys + 1
  else
    if h % 8 >= 4 then at = at + 1 + 5 * n else at = at + 1 + 3 * n end
    keys = keys + n
  end
  decisions = decisions + 1
end
if at < nargs or at > nargs + 1 or keys ~= #KEYS or decisions == 0 then
  return redis.error_reply('token-bucket: the decision headers do not match the keys and arguments')
end
if at == nargs then now = tonumber(ARGV[nargs]) else now = nil end
if not now then
  local t = call('TIME')
  now = t[1] * 1000 + floor(t[2] / 1000)
end
if not (now == now and now ~= HUGE and now ~= -HUGE) then
  return redis.error_reply('token-bucket: now must be a finite number of ms')
end

local function refused(i, k, message)
  return 'token-bucket: bucket ' .. i .. ' (' .. KEYS[k] .. '): ' .. message
end

-- The numbers of bucket i (key k, arguments from a), or nil and why they are refused.
local function numbers(i, k, a, penalty)
  local cap, rate, cost = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  if not cap or cap ~= floor(cap) or cap < 1 or cap > MAX_CAPACITY then
    return nil, refused(i, k, 'capacity must be an integer from 1 to ' .. MAX_CAPACITY)
  end
  if not rate or not (rate > 0) or rate == HUGE or not (cap / rate <= MAX_WINDOW_SECONDS) then
    return nil, refused(i, k, 'refill must be > 0 with capacity / refill at most ' .. MAX_WINDOW_SECONDS .. ' s')
  end
  if not cost or cost ~= floor(cost) or cost < 0 or cost == HUGE then
    return nil, refused(i, k, 'cost must be an integer >= 0')
  end
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
  return cap, rate, cost, block, least
end

-- How far below 0 reservations may have taken a bucket, in tokens: the depth \`d\` the reservations stored
-- (what refilled within the longest wait at their own refill, plus one token for rounding), or, written by
-- an older version, what refills within the longest wait \`w\` (ms) at this caller's refill, plus one; 0
-- without either; at most what refills within the longest window (at most MAX_CAPACITY), as for
-- penalties. A depth in tokens reads the same for every caller whatever its refill (a rolling deploy).
local function reserved(key, rate)
  local s = call('HMGET', key, 'w', 'd')
  local w, d = tonumber(s[1]), tonumber(s[2])
  local least = 0
  if w and w > 0 then least = w * rate / 1000 + 1 end
  if d and d > least then least = d end
  local most = MAX_WINDOW_SECONDS * rate
  if most > MAX_CAPACITY then most = MAX_CAPACITY end
  if not (least <= most) then return most end
  return least
end

-- The numbers of a batch of n reservations of one bucket (key k, arguments from a): capacity, refill, the
-- longest wait any call may have (ms), the costs and the calls' longest waits; or nil and why they are refused.
local function reserveNumbers(k, a, n)
  local cap, rate = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  if not cap or cap ~= floor(cap) or cap < 1 or cap > MAX_CAPACITY then
    return nil, refused(1, k, 'capacity must be an integer from 1 to ' .. MAX_CAPACITY)
  end
  if not rate or not (rate > 0) or rate == HUGE or not (cap / rate <= MAX_WINDOW_SECONDS) then
    return nil, refused(1, k, 'refill must be > 0 with capacity / refill at most ' .. MAX_WINDOW_SECONDS .. ' s')
  end
  local bound = tonumber(ARGV[a + 2])
  if not bound or not (bound >= 0) or bound > MAX_WINDOW_SECONDS * 1000 or not (bound * rate / 1000 <= MAX_CAPACITY) then
    return nil, refused(1, k, 'the longest wait must be from 0 to ' .. MAX_WINDOW_SECONDS * 1000 .. ' ms, with its refill at most ' .. MAX_CAPACITY .. ' tokens')
  end
  local costs, mosts = {}, {}
  for j = 1, n do
    local cost, most = tonumber(ARGV[a + 1 + 2 * j]), tonumber(ARGV[a + 2 + 2 * j])
    if not cost or cost ~= floor(cost) or cost < 0 or cost == HUGE then
      return nil, refused(1, k, 'cost must be an integer >= 0')
    end
    if not most or not (most >= 0) or most > bound then
      return nil, refused(1, k, 'maxWaitMs must be from 0 to the longest wait ' .. bound)
    end
    costs[j], mosts[j] = cost, most
  end
  return cap, rate, bound, costs, mosts
end

-- A bucket as it stands now: tokens (refilled, capped), stamp, whether it has state, whether its
-- state was repaired, when its penalty ends (false: none runs; whoever started it), and whether the
-- key exists at all; or nil and Redis' error when the key holds another type.
local function load(key, cap, rate, block)
  -- A key of another type (another application's, a bad migration) fails its own decision only: the
  -- others of the call go on (\`unusable\`).
  local state = redis.pcall('HMGET', key, 'tokens', 'ts', 'b')
  if state.err then return nil, state.err end
  local e = tonumber(state[3])
  local ends = e ~= nil and e == e and e ~= HUGE and e > now and e
  local t, ts = tonumber(state[1]), tonumber(state[2])
  local exists = state[1] ~= false or state[2] ~= false
  local repaired = false
  if not t or not ts or t ~= t or ts ~= ts or t == HUGE or t == -HUGE or ts == HUGE or ts == -HUGE then
    repaired = exists
    t, ts = cap, now
  else
    -- While a penalty runs, any caller keeps the tokens it left: down to what refills within the longest
    -- window at this caller's rate (at most MAX_CAPACITY), so that its TTL stays within bounds.
    local lowest = block * rate
    if ends then
      lowest = MAX_WINDOW_SECONDS * rate
      if lowest > MAX_CAPACITY then lowest = MAX_CAPACITY end
    end
    if t < 0 and t < -lowest and t < -reserved(key, rate) then
      t = 0
      repaired = true
    end
    if ts > now + FUTURE_TOLERANCE_MS then
      ts = now
      repaired = true
    end
    if now > ts then
      t = t + (now - ts) * rate / 1000
      ts = now
    end
  end
  if t > cap then t = cap end
  return t, ts, exists, repaired, ends, exists or state[3] ~= false
end

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

-- Writes what the decision did to one bucket; answers its tokens and penalty end afterwards.
local nowText, lastTtl, lastTtlText
local function settle(key, mode, allowed, cap, rate, cost, block, least, t, ts, exists, repaired, ends, held)
  if mode == 1 then return t, ends end
  local penalise = false
  if allowed then
    if mode == 2 then
      t = t + cost
      if t > cap then t = cap end
    else
      t = t - cost
    end
  elseif block > 0 and t < cost and not ends then
    penalise = true
    if least < t then t = least end
    ends = now + block * 1000
  end
  local write = penalise or allowed or repaired
  if not write and not (held and call('PTTL', key) == -1) then return t, ends end
  local ttl = ceil(2 * cap / rate * 1000)
  if t < 0 then
    local fill = ceil((cap - t) / rate * 1000)
    if fill > ttl then ttl = fill end
  end
  -- Never gone while its penalty runs (one another caller started, or a stored end), within the bounds.
  if ends and ends - now > ttl then
    ttl = ceil(ends - now)
    if ttl > 2 * MAX_WINDOW_SECONDS * 1000 then ttl = 2 * MAX_WINDOW_SECONDS * 1000 end
  end
  -- Decisions of one call share now, and mostly their policy: each number is printed once per call.
  if ts == now then
    if nowText == nil then nowText = now % 1 == 0 and format('%d', now) end
    if nowText then ts = nowText end
  end
  if ttl ~= lastTtl then
    lastTtl, lastTtlText = ttl, format('%d', ttl)
  end
  if penalise then
    call('HSET', key, 'tokens', t, 'ts', ts, 'b', ends)
  elseif write then
    call('HSET', key, 'tokens', t, 'ts', ts)
  end
  -- Never shorter than the TTL the key has: a caller with other numbers may have set a longer one.
  if not held or (call('PEXPIRE', key, lastTtlText, 'GT') == 0 and call('PTTL', key) == -1) then
    call('PEXPIRE', key, lastTtlText)
  end
  return t, ends
end

local function code(t, allowed)
  local c
  if t % 1 == 0 then
    c = (t * 128 + 109) * 2
  else
    local _, e = frexp(t)
    if e < -60 then e = -60 end
    c = (floor(ldexp(t, 45 - e)) * 128 + e + 64) * 2
  end
  if allowed then return c + 1 end
  return c
end

-- The refusal of a decision whose bucket i (key k) cannot be used: the caller fails that decision alone
-- and does not count it as the store failing (the prefix is what it recognises).
local function unusable(i, k, err)
  return 'token-bucket: unusable key: bucket ' .. i .. ' (' .. KEYS[k] .. '): ' .. err
end

-- Whether a give-back finds the reservation it returns still the last one of its bucket: no reservation
-- came after it, so the count is what that reservation left (tokens \`mt\` at \`mn\`) plus the refill since,
-- within half a token (a later reservation took at least one). Then giving the cost back moves the last
-- turn back by exactly it; otherwise the turns after it stay where they are, and tokens given back would
-- let new callers share their moments, more than B + R*t in a window.
local function last(t, rate, mt, mn)
  if not (mt and mn and mt == mt and mn == mn and mt ~= HUGE and mt ~= -HUGE and mn ~= HUGE and mn ~= -HUGE) then return false end
  local since = now - mn
  if since < 0 then since = 0 end
  return t >= mt + since * rate / 1000 - 0.5
end

local function penaltyLeft(ends)
  if ends then return floor(ends - now) end
  return 0
end

local reply, r = {}, 0
at = 1
local k = 1
for _ = 1, decisions do
  local h = tonumber(ARGV[at])
  local n, mode, penalty = floor(h / 8), h % 4, h % 8 >= 4
  local a0, k0 = at + 1, k
  if h % 8 == 3 then
    at = at + 4 + 2 * n
    k = k + 1
  else
    at = at + 1 + ((penalty or mode == 3) and 5 or 3) * n
    k = k + n
  end
  local stride = penalty and 5 or 3
  if h % 8 == 3 then
    -- n reservations of one bucket (acquire), in order: each takes its cost now if its turn comes within
    -- its longest wait (the bucket may go below 0 by it) and is told when (the wait until the bucket
    -- holds its cost, at least until a running penalty ends); refused, and nothing taken, beyond it. The
    -- bucket is read and written once for all of them.
    local key = KEYS[k0]
    local cap, rate, bound, costs, mosts = reserveNumbers(k0, a0, n)
    local t, ts, exists, repaired, ends, held
    if cap then
      t, ts, exists, repaired, ends, held = load(key, cap, rate, 0)
      if t == nil then rate = unusable(1, k0, ts) end
    end
    if not cap or t == nil then
      if decisions == 1 then return redis.error_reply(rate) end
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
      settle(key, 0, any, cap, rate, 0, 0, 0, t, ts, exists, repaired, ends, held)
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
  elseif n == 1 then
    -- One bucket: the same steps as below, in locals (no tables per decision). A give-back (header 15)
    -- is a refund that says which reservation it returns (\`last\`).
    local key = KEYS[k0]
    local cap, rate, cost, block, least = numbers(1, k0, a0, penalty and h ~= 15)
    local t, ts, exists, repaired, ends, held
    if cap then
      t, ts, exists, repaired, ends, held = load(key, cap, rate, block)
      if t == nil then rate = unusable(1, k0, ts) end
    end
    if not cap or t == nil then
      if decisions == 1 then return redis.error_reply(rate) end
      r = r + 1
      reply[r] = rate
    else
      if h == 15 then mode = 2 end
      local allowed, running = mode == 2 or (t >= cost and not ends), ends
      -- A refund gives back to a bucket below 0 by reservations only the last one: other callers' turns are set.
      local gives = allowed
      if mode == 2 and t < 0 and reserved(key, rate) > 0 and not (h == 15 and last(t, rate, tonumber(ARGV[a0 + 3]), tonumber(ARGV[a0 + 4]))) then
        gives = false
      end
      t, ends = settle(key, mode, gives, cap, rate, cost, mode == 2 and 0 or block, least, t, ts, exists, repaired, ends, held)
      r = r + 1
      reply[r] = code(allowed and t or shown(t, cost, rate, running), allowed)
      if penalty and h ~= 15 then
        r = r + 1
        reply[r] = penaltyLeft(ends)
      end
    end
  else
    local caps, rates, costs, blocks, leasts = {}, {}, {}, {}, {}
    local problem
    local seen = {}
    for i = 1, n do
      local key = KEYS[k0 + i - 1]
      if seen[key] then
        problem = refused(i, k0 + i - 1, 'the same key twice in one decision')
        break
      end
      seen[key] = true
      local cap, rate, cost, block, least = numbers(i, k0 + i - 1, a0 + stride * (i - 1), penalty)
      if not cap then
        problem = rate
        break
      end
      caps[i], rates[i], costs[i], blocks[i], leasts[i] = cap, rate, cost, block, least
    end
    local tokens, stamps, exists, repaired, ends, held = {}, {}, {}, {}, {}, {}
    if not problem then
      for i = 1, n do
        tokens[i], stamps[i], exists[i], repaired[i], ends[i], held[i] = load(KEYS[k0 + i - 1], caps[i], rates[i], blocks[i])
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
        if tokens[i] < costs[i] or ends[i] then allowed = false end
      end
      if mode == 2 then allowed = true end
      local running = {}
      for i = 1, n do
        running[i] = ends[i]
        -- A refund gives nothing back to a bucket below 0 by reservations: other callers' turns are set.
        local gives = allowed and not (mode == 2 and tokens[i] < 0 and reserved(KEYS[k0 + i - 1], rates[i]) > 0)
        tokens[i], ends[i] = settle(KEYS[k0 + i - 1], mode, gives, caps[i], rates[i], costs[i], mode == 2 and 0 or blocks[i], leasts[i], tokens[i], stamps[i], exists[i], repaired[i], ends[i], held[i])
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
`;
