--[[ Create a consumer group on a partition's stream (docs/CONSUMERS.md):
atomic, so that nothing is trimmed between the look at the stream's first
entry and the create.

KEYS[1] ns:{p}:@stream   KEYS[2..4] the group's holders, docs and inbox (consume_take.lua)
ARGV[1] group   ARGV[2] "all" | "new"
"all": the group starts before the first entry the stream holds (the
trimmed past is not counted lost); "new": after its last entry.
A new group has nothing pending: what a destroyed group of that name left
in its holders, docs and inbox is deleted (a stream deleted and written
again, `XGROUP DESTROY` without the keys).
Returns 1 when created, 0 when the group existed.
]]

local stream, group = KEYS[1], ARGV[1]
local start = '$'
if ARGV[2] == 'all' then
  local first = redis.call('XRANGE', stream, '-', '+', 'COUNT', 1)
  if first[1] then
    start = (tonumber(string.match(first[1][1], '^(%d+)')) - 1) .. '-0'
  end
end
local ok = redis.pcall('XGROUP', 'CREATE', stream, group, start, 'MKSTREAM')
if type(ok) == 'table' and ok.err then
  if string.find(ok.err, 'BUSYGROUP', 1, true) then return 0 end
  return ok
end
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4])
return 1
