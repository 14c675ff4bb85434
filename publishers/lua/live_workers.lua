-- cdc-sync live_workers: the workers whose registration has not expired
-- (publishers/control.py, live_workers and workers).
--
-- KEYS[1]  ns:@workers   sorted set written by register_worker.lua
-- (no ARGV)
--
-- Returns the ids of the live workers.
--
-- Not for atomicity (it is one read): a script, not a plain ZRANGEBYSCORE,
-- because "now" must be Redis's own clock (TIME), the one register_worker.lua
-- scores with: sidecars with skewed clocks then agree on who is alive.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZRANGEBYSCORE', KEYS[1], string.format('%d', now), '+inf')
