-- cdc-sync fence_raise: raise a table's field in a partition's @fence to a
-- token, never lower it (publishers/purge.py, Deleter._drop_keys).
--
-- KEYS[1]  ns:{p}:@fence   hash: table (JSON text) -> highest fencing token seen
-- ARGV[1]  the table's field: its name as JSON text, quotes included
-- ARGV[2]  the token (decimal string)
--
-- Returns 1, or the error "FENCED ..." (nothing written) when the field holds
-- a higher token: a newer lease owner has written the partition.
--
-- Why: a purge leaves the table's field in a partition that another section
-- keeps, at the purge's own token, so that a sidecar that lost the table
-- before the purge (its token is lower) stays fenced out of it afterwards,
-- even where the purge had no document to delete (no apply call set it).
-- Atomic for the same reason as fenced_checkpoint.lua: the check and the
-- write must not be split by a newer owner's write. Tokens are decimal
-- strings compared by length then bytes (no tonumber: Lua numbers are doubles).
local seen = redis.call('HGET', KEYS[1], ARGV[1]) or '0'
local mine = ARGV[2]
if #seen > #mine or (#seen == #mine and seen > mine) then
  return redis.error_reply('FENCED ' .. ARGV[1] .. ' token ' .. mine .. ' is below ' .. seen)
end
if seen ~= mine then redis.call('HSET', KEYS[1], ARGV[1], mine) end
return 1
