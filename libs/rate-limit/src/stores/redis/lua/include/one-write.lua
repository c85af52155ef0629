-- one-write.lua: after one-refill.lua, the usual call's write: the tokens `t` and stamp `ts` when the
-- decision (`allowed`) or a repair changed them, with the TTL 2 * cap / rate, never shortening the one
-- the key has (a caller with other numbers may have set a longer one); a refused bucket without a TTL
-- gets one. GT leaves a key without TTL as it is, so a refused GT asks PTTL; a key written this ms most
-- likely has this TTL already, so PTTL first (one call either way in the usual cases).
if allowed or repaired then
  call('HSET', key, 'tokens', t, 'ts', ts)
  local ms = ceil(2 * cap / rate * 1000)
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
