#!lua flags=no-writes
-- cdc-sync stale_keys: which documents a re-snapshot's sweep must delete
-- (publishers/documents.py, Documents.stale_keys).
--
-- KEYS     ns:{p}:section:dataKey of one index page (one partition: one slot)
-- ARGV[1]  the version of the re-snapshot (decimal string)
--
-- Returns the (1-based) positions in KEYS of the documents whose @v is set
-- and is not ARGV[1].
--
-- Not for atomicity (it only reads): one call per index page instead of one
-- HGET per document (parsing 1,000 pipelined replies cost more than the
-- sweep). The shebang line must stay first: no-writes declares the script
-- read-only (Redis 7), so Redis may run it where writes are refused.
local out = {}
for i = 1, #KEYS do
  local v = redis.call('HGET', KEYS[i], '@v')
  if v and v ~= ARGV[1] then out[#out + 1] = i end
end
return out
