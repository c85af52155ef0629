-- code.lua: the reply code of a bucket, in the includer's new local `c`, from its locals `t` (tokens
-- after the decision) and `allowed` (the verdict of the whole decision).
--
-- Code = ((m * 128) + e + 64) * 2 + allowed: the tokens as a float with a 45-bit signed mantissa
-- m = floor(t * 2^(45 - e)) and the binary exponent e of t (frexp; at least -60, so tokens below 2^-61
-- come out as 0 or a fraction of 2^-61), and allowed 1 or 0. An integer below 2^53 in magnitude; the
-- tokens it carries are never more than the bucket's, and less by under 2^-44 of them (`decodeTokens`
-- in script-codec.ts). Whole tokens (a bucket refilled to capacity, the common case) skip frexp and
-- ldexp: m = t, e = 45, which the same decoding reads back exactly (|t| <= 1e12, so m * 256 < 2^53).
local c
if t % 1 == 0 then
  c = (t * 128 + 109) * 2
else
  local _, e = frexp(t)
  if e < -60 then e = -60 end
  c = (floor(ldexp(t, 45 - e)) * 128 + e + 64) * 2
end
if allowed then c = c + 1 end
