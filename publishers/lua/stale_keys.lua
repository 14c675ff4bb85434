#!lua flags=no-writes
-- cdc-sync stale_keys: which documents a re-snapshot's sweep must delete
-- (publishers/documents.py, Documents.stale_keys).
--
-- KEYS     ns:{p}:section:dataKey of one index page (one partition: one slot)
-- ARGV     the versions the re-snapshot wrote its documents at (decimal
--          strings: one, or one per part of a resumed snapshot)
--
-- Returns the (1-based) positions in KEYS of the documents whose @v is set
-- and is none of ARGV.
--
-- Not for atomicity (it only reads): one call per index page instead of one
-- HGET per document (parsing 1,000 pipelined replies cost more than the
-- sweep). The shebang line must stay first: no-writes declares the script
-- read-only (Redis 7), so Redis may run it where writes are refused.
local seen = {}
for j = 1, #ARGV do seen[ARGV[j]] = true end
local out = {}
for i = 1, #KEYS do
  local v = redis.call('HGET', KEYS[i], '@v')
  if v and not seen[v] then out[#out + 1] = i end
end
return out
