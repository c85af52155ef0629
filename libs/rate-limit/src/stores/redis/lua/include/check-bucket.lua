-- check-bucket.lua: whether a bucket's numbers can be used. Reads the includer's locals `cap` and
-- `rate` (tonumber of the arguments: nil when not a number) and sets its local `why` to the reason they
-- are refused, leaving it as it was (nil) when they are usable. Capacity: an integer from 1 to
-- MAX_CAPACITY; refill: > 0 and finite, with the window capacity / refill at most MAX_WINDOW_SECONDS.
if not cap or cap ~= floor(cap) or cap < 1 or cap > MAX_CAPACITY then
  why = 'capacity must be an integer from 1 to ' .. MAX_CAPACITY
elseif not rate or not (rate > 0) or rate == HUGE or not (cap / rate <= MAX_WINDOW_SECONDS) then
  why = 'refill must be > 0 with capacity / refill at most ' .. MAX_WINDOW_SECONDS .. ' s'
end
