--[[ Create a consumer group on a partition's stream (docs/CONSUMERS.md):
atomic, so that nothing is trimmed between the look at the stream's first
entry and the create.

KEYS[1] ns:{p}:@stream   KEYS[2..4] the group's holders, docs and inbox (consume_take.lua)
ARGV[1] group   ARGV[2] "all" | "new"   ARGV[3] "1": make the stream if it is missing
(a new group); "0": a group created again after it vanished waits for the
stream to be written again (returns -1 meanwhile), so that its start is the
stream's first entry, not an empty stream's 0 (which would report the
messages before it lost a second time)
"all": the group starts before the first entry the stream holds (the
trimmed past is not counted lost); "new": after its last entry.
A new group has nothing pending: what a destroyed group of that name left
in its holders, docs and inbox is deleted (a stream deleted and written
again, `XGROUP DESTROY` without the keys).
Returns 1 when created, 0 when the group existed, -1 when the stream is missing (ARGV[3] "0").
]]

local stream, group = KEYS[1], ARGV[1]
if ARGV[3] == '0' and redis.call('EXISTS', stream) == 0 then return -1 end
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
