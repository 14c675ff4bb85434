#!lua flags=no-writes
-- cdc-sync stale_keys: which documents a re-snapshot's sweep must delete
-- (publishers/documents.py, Documents.stale_keys).
--
-- KEYS[1]    ns:{p}:@seen:section: the data keys the whole snapshot wrote
-- KEYS[1+i]  ns:{p}:section:dataKey of one index page (one partition: one slot)
-- ARGV[i]    that data key
--
-- Returns the (1-based) positions i of the live documents (@v set, no @del)
-- the snapshot did not write. By key, not by version: a snapshot taken at the
-- same version as the documents before it (nothing written at the source in
-- between, e.g. after a change of the key template) cannot tell an old
-- document from one it wrote by @v.
--
-- Not for atomicity (it only reads): one call per index page instead of one
-- HGET per document (parsing 1,000 pipelined replies cost more than the
-- sweep). The shebang line must stay first: no-writes declares the script
-- read-only (Redis 7), so Redis may run it where writes are refused.
local seen = KEYS[1]
local out = {}
for i = 1, #ARGV do
  local state = redis.call('HMGET', KEYS[1 + i], '@v', '@del')
  if state[1] and not state[2] and redis.call('SISMEMBER', seen, ARGV[i]) == 0 then
    out[#out + 1] = i
  end
end
return out
