import { createHash } from 'node:crypto';
import { FUTURE_TOLERANCE_MS, MAX_CAPACITY, MAX_WINDOW_SECONDS } from '../token-bucket.js';
import { GENERAL_PATH_LUA } from './token-bucket.general-path.js';

/**
 * The token bucket in Lua: reads, refills, drains and writes every bucket of a decision in one atomic
 * script, and can carry several independent decisions in one call (coalescing: each is decided on its
 * own, in order, as if it had been sent alone). Kept in a TypeScript module so that builds carry it
 * without copying assets.
 *
 * KEYS             the buckets of every decision, decision after decision; a key may appear once per
 *                  decision (callers merge repeats), any number of times across decisions
 * ARGV             per decision:
 *   header         n * 8 + (4 when a bucket of it has a penalty) + mode (0 take: drain all or none,
 *                  1 peek: write nothing, 2 refund: give the cost back), n = its number of buckets;
 *                  or n * 8 + 3: n reservations (acquire) of one bucket (one key), in order;
 *                  or 15: a give-back of one reservation of one bucket (a refund that names it)
 *   per bucket     capacity, refill per second, cost (and blockSeconds, penalty cost after a header
 *                  with the 4 bit; after 15, the tokens the reservation left and the ms it was made
 *                  at, as its reply said)
 *   reservations   capacity, refill per second, the longest wait of any call (ms), then per
 *                  reservation its cost and the call's longest wait (ms)
 *                  and last, optionally, now in ms (tests); without it Redis TIME is the clock (the only
 *                  clock: app instances may be skewed)
 *
 * Reply            a call of one decision over one bucket without a penalty (the usual case): one
 *                  integer, the bucket's code. Otherwise an array, decision after decision: the code of
 *                  each bucket, then with a penalty the whole ms it still runs after now, per bucket
 *                  (0: none); a decision whose arguments are refused is one error string instead, and
 *                  so is one whose key holds another type ('token-bucket: unusable key: ...'; alone,
 *                  an error reply with that text). Reservations: per reservation the bucket's code
 *                  after it and the wait in ms until its turn (also when refused: the wait it would
 *                  have had), then once now (ms, the clock they were decided by): a turn is now +
 *                  its wait by Redis' clock.
 * Code             ((m * 128) + e + 64) * 2 + allowed: the bucket's tokens after the decision as a float
 *                  with a 45-bit signed mantissa m = floor(tokens * 2^(45 - e)) and the binary exponent
 *                  e of the tokens (frexp; at least -60, so tokens below 2^-61 come out as 0 or a
 *                  fraction of 2^-61), and allowed 1 or 0 (the verdict of the whole decision). An
 *                  integer below 2^53 in magnitude; the tokens it carries are never more than the
 *                  bucket's, and less by under 2^-44 of them (`decodeTokens` in token-bucket.codec.ts). Whole
 *                  tokens (a bucket that refilled to capacity, the common case) skip frexp/ldexp:
 *                  m = tokens, e = 45, which the same decoding reads back exactly (|tokens| <= 1e12,
 *                  so m * 256 stays below 2^53).
 *
 * The usual call takes a fast path of its own, before anything else is set up: the same arithmetic as
 * the general path's `load`, `settle` and `code` for one bucket without a penalty, written out inline
 * (Redis CPU per decision is what the library's capacity comes down to, and a closure made per call
 * costs more than the copy). The model test runs random sequences through both paths, and the coalescing test checks
 * the codes of both.
 *
 * Numbers are written as Lua numbers: Redis turns a number argument of redis.call into a string that
 * reads back as the same double (test/properties/token-bucket/script-numbers checks it), so no string.format.
 *
 * The general path (every other call: several buckets or decisions, penalties, reservations, and
 * state it cannot trust) is `GENERAL_PATH_LUA` in token-bucket.general-path.ts, appended below.
 */
export const TOKEN_BUCKET_LUA = `
local MAX_CAPACITY = ${MAX_CAPACITY}
local MAX_WINDOW_SECONDS = ${MAX_WINDOW_SECONDS}
local FUTURE_TOLERANCE_MS = ${FUTURE_TOLERANCE_MS}
local HUGE = math.huge
local floor, ceil, frexp, ldexp, format = math.floor, math.ceil, math.frexp, math.ldexp, string.format
local call = redis.call

local nargs = #ARGV
local now

-- The usual call: one take, peek or refund of one bucket without a penalty; one integer back.
if #KEYS == 1 and (nargs == 4 or nargs == 5) then
  if nargs == 5 then now = tonumber(ARGV[5]) end
  if not now then
    local t = call('TIME')
    now = t[1] * 1000 + floor(t[2] / 1000)
  end
  local h, cap, rate, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
  if (h == 8 or h == 9 or h == 10) and cap and cap % 1 == 0 and cap >= 1 and cap <= MAX_CAPACITY
    and rate and rate > 0 and rate ~= HUGE and cap / rate <= MAX_WINDOW_SECONDS
    and cost and cost % 1 == 0 and cost >= 0 and cost ~= HUGE and now == now and now ~= HUGE and now ~= -HUGE then
    local key = KEYS[1]
    local state = redis.pcall('HMGET', key, 'tokens', 'ts', 'b')
    if state.err then return redis.error_reply('token-bucket: unusable key: bucket 1 (' .. key .. '): ' .. state.err) end
    local e = state[3] and tonumber(state[3])
    local t = tonumber(state[1])
    -- A penalty runs (set by a caller of this bucket with other numbers), or the tokens are below 0
    -- (reservations of acquire(), a penalty's leftovers, or damage): the general path decides.
    if not (e and e > now and e ~= HUGE) and not (t and t < 0) then
      local ts = tonumber(state[2])
      local exists = state[1] ~= false or state[2] ~= false
      local held = exists or state[3] ~= false
      -- Written in this very ms (a hot key): most likely with the TTL this call would set.
      local fresh = ts == now
      local repaired = false
      if not t or not ts or t ~= t or ts ~= ts or t == HUGE or t == -HUGE or ts == HUGE or ts == -HUGE then
        repaired = exists
        t, ts = cap, now
      else
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
        if allowed or repaired then
          call('HSET', key, 'tokens', t, 'ts', ts)
          local ms = ceil(2 * cap / rate * 1000)
          -- Never shorter than the TTL the key has (a caller with other numbers may have set a longer one).
          -- GT leaves a key without TTL as it is, so a refused GT asks PTTL; a key written this ms most
          -- likely has this TTL already, so PTTL first (one call either way in the usual cases).
          if not held then
            call('PEXPIRE', key, format('%d', ms))
          elseif fresh then
            if call('PTTL', key) < ms then call('PEXPIRE', key, format('%d', ms)) end
          elseif call('PEXPIRE', key, format('%d', ms), 'GT') == 0 and call('PTTL', key) == -1 then
            call('PEXPIRE', key, format('%d', ms))
          end
        elseif held and call('PTTL', key) == -1 then
          call('PEXPIRE', key, format('%d', ceil(2 * cap / rate * 1000)))
        end
      end
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
  end
  -- Anything else (a refused argument among them) takes the general path, which says what is wrong.
end

${GENERAL_PATH_LUA}`;

/** ioredis command name; carries the script's digest so that a changed script never runs under an old name. */
export const TOKEN_BUCKET_COMMAND = `rateLimitTokenBucket_${createHash('sha1').update(TOKEN_BUCKET_LUA).digest('hex').slice(0, 12)}`;

export type TokenBucketMode = 'take' | 'peek' | 'refund';
