-- cdc-sync register_worker: add, refresh or remove a worker in the registry
-- (publishers/control.py, keep_alive and remove_heartbeat).
--
-- KEYS[1]  ns:@workers   sorted set: worker id -> when its registration
--                        expires, in ms of Redis's own clock (TIME)
-- ARGV[1]  worker id
-- ARGV[2]  TTL in ms; "0" removes the worker
--
-- Returns ZADD's or ZREM's reply (how many members were added / removed).
--
-- Atomic, and timed by Redis's clock rather than the caller's, so that
-- sidecars with skewed clocks agree on who is alive; expired entries are
-- dropped at every registration, in the same call, so the set stays small.
-- Listing the live workers is then one ZRANGEBYSCORE (live_workers.lua), not
-- a SCAN of a keyspace that holds every document.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. string.format('%d', now))
if ARGV[2] == '0' then
  return redis.call('ZREM', KEYS[1], ARGV[1])
end
return redis.call('ZADD', KEYS[1], string.format('%d', now + tonumber(ARGV[2])), ARGV[1])
