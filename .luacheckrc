-- luacheck's settings for the Redis scripts (libs/rate-limit/src/stores/redis/lua). test/redis/scripts
-- checks each script as assembled (its includes in place): the parts alone use their includer's locals.
std = 'lua51'
-- What Redis gives a script (EVAL/EVALSHA): the redis object and the two argument tables.
read_globals = { 'redis', 'KEYS', 'ARGV' }
max_line_length = false
-- 'not (x > y)' is deliberate: with NaN both x > y and x <= y are false, and the scripts refuse NaN so.
ignore = { '581' }
