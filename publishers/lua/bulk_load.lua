#!lua
--[[
cdc-sync bulk_load: a page of a bulk snapshot's rows for ONE partition and ONE
section: documents and index written, no stream entry and no message per row
(publishers/bulk.py; docs/REDIS.md "The bulk snapshot"). Subscribers learn of
the section's new documents from ONE "R" message once the snapshot is done
(bulk_marker.lua).

KEYS[1]      ns:{p}:@fence          hash: table -> highest fencing token seen
KEYS[2]      ns:{p}:@index:section
KEYS[3]      ns:{p}:@seen:section   set: the data keys this whole snapshot wrote
             (reset "1" only: its sweep deletes the documents it lacks)
KEYS[3+i]    ns:{p}:section:dataKey of row i           (i = 1..N)

ARGV[1] table as JSON text (its @fence field, as apply.lua)   ARGV[2] fencing token (decimal; "0": not fenced)
ARGV[3] reset: "1" writes over any @v (a full snapshot is the truth at its
        version, even over a source that went back in time) and records the
        written keys in KEYS[3] for the sweep; "n" the same without recording
        (a full snapshot with nothing to sweep: the section had written no
        partition before it); "0" leaves a document (or
        tombstone) whose @v is above the version (a partial snapshot, which
        the change stream may have passed)
ARGV[4] version (decimal)   ARGV[5] ts (ISO 8601)   ARGV[6] C columns
ARGV[7..6+C] the hash fields
ARGV[7+C]    the rows: a MessagePack array of N x [data key, value 1..C (JSON
             text)], flat, every item a str (publishers/mpack.py; one argument
             instead of 1+C a row: Redis parses and frees each argument)

Errors, before anything is written: "CDCLAYOUT ..." (the index or the fence
of another type), "FENCED ..." (a lower token than the partition has seen).
Returns one character per row: 'w' written, 's' stale (left: newer @v),
'x' the document key holds another type (nothing written: the caller
dead-letters that row, as apply.lua's WRONGTYPE would).

Atomic per call because the fence check and the writes must not be split (a
sidecar that lost the lease could otherwise write after the new owner), and
a subscriber's load (load_partition.lua) sees a call's rows all or none.

Every row is a whole document: a key already there is deleted and written
again, so a column the row lacks (a dropped column) does not survive. Reset
"n" (documents there are rare) writes the row at once and finds a key there
only when HSET added fewer fields than the row has; "1" and "0" (documents
there are the rule) read @v first. Versions are compared as decimal strings
(length, then bytes), never as Lua numbers.
--]]

local call, pcall_redis, unpack = redis.call, redis.pcall, unpack
local fence_key, index, seen_set = KEYS[1], KEYS[2], KEYS[3]
local tbl, token, version, ts = ARGV[1], ARGV[2], ARGV[4], ARGV[5]
local mode = ARGV[3]
local reset, record = mode ~= '0', mode == '1'
local ncols = tonumber(ARGV[6])
local rows = cmsgpack.unpack(ARGV[7 + ncols])  -- before anything is written: a bad argument fails here

local function newer(a, b)
  if #a ~= #b then return #a > #b end
  return a > b
end

local function wrong(key, want)
  local t = call('TYPE', key)['ok']
  if t ~= 'none' and t ~= want then return key .. ' holds a ' .. t .. ', expected a ' .. want end
end
local problem = wrong(index, 'set') or wrong(fence_key, 'hash') or wrong(seen_set, 'set')
if problem then return redis.error_reply('CDCLAYOUT ' .. problem) end

if token ~= '0' then
  local seen = call('HGET', fence_key, tbl) or '0'
  if newer(seen, token) then
    return redis.error_reply('FENCED ' .. tbl .. ' token ' .. token .. ' is below ' .. seen)
  end
  if seen ~= token then call('HSET', fence_key, tbl, token) end
end

-- a row's HSET arguments: the field names are written once here, each row
-- writes only its values between them (Redis CPU a row of ten columns, median
-- 7.38 -> 7.11 us: eight interleaved runs of 100 calls of 1,000 rows, INFO cpu)
local fields = {'@v', version, '@ts', ts}
for c = 1, ncols do fields[3 + 2 * c] = ARGV[6 + c] end

-- reset "n" writes first and looks after: HSET adds every field of the row
-- to a key that held nothing, fewer to a document already there, which is
-- then deleted and written whole. One Redis call a row instead of an HGET
-- before the HSET: Redis CPU a row of ten columns, median 6.75 -> 6.35 us
-- (five interleaved runs of 200 calls of 1,000 rows, INFO cpu). Not for "1"
-- or "0", whose keys mostly hold documents: HSET, DEL, HSET would cost more
-- than HGET, DEL, HSET, and replicas and the AOF would get three writes a row.
local nfields = 2 + ncols
local function write_over(doc)
  local added = pcall_redis('HSET', doc, unpack(fields))
  if type(added) == 'table' then
    if added.err:sub(1, 9) == 'WRONGTYPE' then return 'x' end
    error(added)  -- not the row's fault (out of memory, say): the call fails, as call() would
  end
  if added ~= nfields then
    call('DEL', doc)
    call('HSET', doc, unpack(fields))
  end
  return 'w'
end

local function write_read_first(doc)
  local seen = pcall_redis('HGET', doc, '@v')
  if type(seen) == 'table' and seen.err then return 'x' end
  if seen and not reset and newer(seen, version) then return 's' end
  if seen then call('DEL', doc) end
  call('HSET', doc, unpack(fields))
  return 'w'
end
local write = mode == 'n' and write_over or write_read_first

-- the page's keys are added to the index and to the seen set after the loop,
-- in one variadic SADD each, not one SADD a row: Redis CPU a row of ten
-- columns, median 16.3 -> 15.3 us (six interleaved runs of 100 calls of 1,000
-- rows each, INFO cpu, quiet machine)
local statuses, indexed, written = {}, {}, {}
local r = 1
for i = 1, #KEYS - 3 do
  local key = rows[r]
  for c = 1, ncols do fields[4 + 2 * c] = rows[r + c] end
  local status = write(KEYS[3 + i])
  if status == 'w' then indexed[#indexed + 1] = key end
  if record and status ~= 'x' then written[#written + 1] = key end
  statuses[i] = status
  r = r + 1 + ncols
end
local function add_all(set, members)  -- a thousand at a time: Lua's unpack has a stack limit
  for first = 1, #members, 1000 do
    call('SADD', set, unpack(members, first, math.min(first + 999, #members)))
  end
end
add_all(index, indexed)
add_all(seen_set, written)
return table.concat(statuses)
