-- cdc-sync fenced_checkpoint: store a table's checkpoint unless a newer lease
-- owner has written it (publishers/manager.py, DataManager.set_checkpoint).
--
-- KEYS[1]  ns:@checkpoint:table   hash: version, updated_at, state, fence
-- ARGV[1]  version (decimal string)
-- ARGV[2]  updated_at (ISO 8601)
-- ARGV[3]  state: snapshotting | streaming
-- ARGV[4]  fencing token of the writer's lease (decimal string)
--
-- Returns 1, or the error "FENCED ..." (nothing written) when the hash has
-- seen a higher token than ARGV[4].
--
-- Atomic because the token check and the write must not be split: a stale
-- owner that read the old token could otherwise write after the new owner.
-- The hash keeps the highest token that wrote it (field "fence"). Tokens are
-- decimal strings compared by length then bytes, like versions (no tonumber:
-- Lua numbers are doubles).
local seen = redis.call('HGET', KEYS[1], 'fence') or '0'
local mine = ARGV[4]
if #seen > #mine or (#seen == #mine and seen > mine) then
  return redis.error_reply('FENCED checkpoint token ' .. mine .. ' is below ' .. seen)
end
redis.call('HSET', KEYS[1], 'version', ARGV[1], 'updated_at', ARGV[2], 'state', ARGV[3], 'fence', mine)
return 1
