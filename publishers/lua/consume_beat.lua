--[[ A consumer says it is alive in a partition (docs/CONSUMERS.md), or,
with a TTL of 0, that it left: the others take its pending entries at their
next read. A script for Redis's clock (TIME), the one all consumers compare
with, and an atomic look-and-renew.

KEYS[1] ns:{p}:@group:g:alive   KEYS[2] ns:{p}:@stream
ARGV[1] consumer   ARGV[2] TTL (ms)
Returns 1 if the consumer was registered, 0 if not (it was presumed dead
and its entries were taken by others). With the stream missing (the group
went with it) nothing is written, and it returns 1: the consumer's next
take reports the group gone.
]]

if redis.call('EXISTS', KEYS[2]) == 0 then return 1 end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local was = redis.call('HEXISTS', KEYS[1], ARGV[1])
local ttl = tonumber(ARGV[2])
if ttl > 0 or was == 1 then
  redis.call('HSET', KEYS[1], ARGV[1], now + ttl)
end
return was
