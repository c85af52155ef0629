-- refill.lua: a trusted bucket's tokens brought to now. Reads and sets the includer's locals `t`
-- (tokens) and `ts` (their stamp, ms), sets `repaired` when the stamp was damage; reads `now` and `rate`
-- (tokens per second). A stamp more than FUTURE_TOLERANCE_MS ahead of now is damage and becomes now
-- (the tokens are kept); within it, a stamp ahead of now is kept and nothing refills until the clock
-- passes it (a Redis clock that steps back a little refills no time twice). The includer caps `t` at
-- the capacity afterwards.
if ts > now + FUTURE_TOLERANCE_MS then
  ts = now
  repaired = true
end
if now > ts then
  t = t + (now - ts) * rate / 1000
  ts = now
end
