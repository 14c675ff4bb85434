#!lua
--[[
cdc-sync apply: one bounded batch of changes for ONE partition, atomically.
See docs/REDIS.md ("The apply script") and publishers/apply.py (_CallBuilder).

Atomic because the apply rule (DESIGN.md section 4) reads and writes
together: the @v check, the document write, @seq, the stream entry and the
message must not interleave with another call, or @seq would gap or a stale
version win. All KEYS share the {p} hash tag: one slot on a cluster.

KEYS[1]          ns:{p}:@seq
KEYS[2]          ns:{p}:@stream
KEYS[3]          ns:{p}:@fence   hash: table -> highest fencing token seen
KEYS[3+g]        ns:{p}:@index:section of group g          (g = 1..G)
KEYS[3+G+i]      ns:{p}:section:dataKey of change i         (i = 1..N)

ARGV[1]  partition as a JSON string      ARGV[5]  PUBLISH | SPUBLISH
ARGV[2]  ts, ISO 8601 (no quoting need)  ARGV[6]  G  groups (section, table)
ARGV[3]  stream MAXLEN (approximate)     ARGV[7]  C  columns
ARGV[4]  tombstone TTL in ms             ARGV[8]  H  shapes (column lists)
then G x [section JSON, table JSON, channel, byte length of "ns:{p}:section:",
          fencing token of the table's lease (decimal; "0": not fenced)]
then C x [hash field, name as JSON string, RFC 6901 path as JSON string]
then H x [n, column 1..n]
then N x [group, key JSON, op, version, reset 0|1, shape (0 = delete), value 1..n]

Errors, each returned before anything of the failing change is written:
- "CDCLAYOUT ...": a key the partition shares (@seq, @stream, @fence, an
  index) is damaged; checked for the whole call before anything is written;
- "NOPERM ...": the ACL refuses to let this user publish on a section's
  channel (a call's KEYS are checked by Redis itself before the script runs);
- "FENCED ...": a group's token is below the one the partition has seen for
  its table: a sidecar that lost its lease (paused past it) cannot write after
  the new owner did. Checked for the whole call before anything is written.
Python (publishers/apply.py) reports the changes of a CDCLAYOUT or NOPERM
call as blocked; any other error is the content of one change (bisected).

Returns {statuses, seq}: one character per change ('p' applied and published,
'a' applied with nothing visible to publish, 's' stale: dropped), and the
partition's @seq after the call, as a decimal string.

Versions and values are never converted to numbers: Lua numbers are doubles,
so a bigint above 2^53 or a large version would be corrupted. Versions are
decimal strings compared by length, then bytes; values are JSON text compared
byte for byte and spliced into the message. The script never JSON-encodes a
value; the only text it quotes itself is the name of a column that vanished
from a row (cjson.encode of a string is exact).
--]]

local KEYS, ARGV = KEYS, ARGV
local call, pcall_redis, unpack, concat = redis.call, redis.pcall, unpack, table.concat
local tonumber, format, sub, byte = tonumber, string.format, string.sub, string.byte

local seq_key, stream_key, fence_key = KEYS[1], KEYS[2], KEYS[3]
local partition, ts = ARGV[1], ARGV[2]
local maxlen, ttl, publish = ARGV[3], ARGV[4], ARGV[5]
local ngroups, ncols, nshapes = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])

-- a > b, for decimal strings without leading zeros
local function newer(a, b)
  if #a ~= #b then return #a > #b end
  return a > b
end

local function layout_error(msg)
  return redis.error_reply('CDCLAYOUT ' .. msg)
end

-- shared keys of the call: a wrong type here is corruption, not a bad change,
-- so it fails the call before anything is written
local function check_type(key, want)
  local t = call('TYPE', key)['ok']
  if t ~= 'none' and t ~= want then
    return key .. ' holds a ' .. t .. ', expected a ' .. want
  end
end

local problem = check_type(seq_key, 'string') or check_type(stream_key, 'stream')
local a = 9
local groups = {}
for g = 1, ngroups do
  groups[g] = {section = ARGV[a], tbl = ARGV[a + 1], channel = ARGV[a + 2],
               plen = tonumber(ARGV[a + 3]), token = ARGV[a + 4], index = KEYS[3 + g]}
  problem = problem or check_type(KEYS[3 + g], 'set')
  a = a + 5
end
problem = problem or check_type(fence_key, 'hash')
if problem then return layout_error(problem) end

local seq = tonumber(call('GET', seq_key) or '0')
if seq == nil then return layout_error(seq_key .. ' does not hold an integer') end

-- every message id is <seq>-0, so the stream's last id can never pass @seq;
-- if it did, each XADD would fail: refuse now, before the fence is written
if call('EXISTS', stream_key) == 1 then
  local info = call('XINFO', 'STREAM', stream_key)
  for i = 1, #info, 2 do
    if info[i] == 'last-generated-id' then
      local top = tonumber(string.match(info[i + 1], '^(%d+)'))
      if top > seq then
        return layout_error(stream_key .. ' is ahead of ' .. seq_key .. ' (last id '
          .. info[i + 1] .. ', @seq ' .. format('%d', seq) .. ')')
      end
    end
  end
end

-- tokens are decimal strings, compared like versions (never tonumber'd)
for g = 1, ngroups do
  local token = groups[g].token
  if token ~= '0' then
    local seen = call('HGET', fence_key, groups[g].tbl) or '0'
    if newer(seen, token) then
      return redis.error_reply('FENCED ' .. groups[g].tbl .. ' token ' .. token .. ' is below ' .. seen)
    end
    if seen ~= token then call('HSET', fence_key, groups[g].tbl, token) end
  end
end

-- columns as three flat arrays (hash field, JSON name, JSON path): no table per
-- column. A shape is a row's column list, as column numbers; reads[h] is what
-- HMGET fetches for it: the meta fields, then the columns (a delete, shape 0,
-- reads only the meta fields)
local field, jname, jpath = {}, {}, {}
for c = 1, ncols do
  field[c], jname[c], jpath[c] = ARGV[a], ARGV[a + 1], ARGV[a + 2]
  a = a + 3
end
local shapes, reads = {}, {[0] = {'@v', '@del'}}
for h = 1, nshapes do
  local n = tonumber(ARGV[a])
  local shape, read = {}, {'@v', '@del', '@ts'}
  for j = 1, n do
    local c = tonumber(ARGV[a + j])
    shape[j], read[3 + j] = c, field[c]
  end
  shapes[h], reads[h] = shape, read
  a = a + n + 1
end

local tombstone_patch = '[{"op":"replace","path":"","value":null}]'

-- publishes the change message, appends it to the stream and advances @seq;
-- returns an error reply's text when the message cannot go out.
-- PUBLISH goes first: an ACL that refuses the channel (the one refusal Redis
-- cannot check before the script runs) fails it before this change writes
-- anything. XADD cannot fail (the stream was checked against @seq above), and
-- INCR follows at once, so @seq and the stream stay in step even if a later
-- change of this call aborts the script (WRONGTYPE). Nobody sees the message
-- before it is in the stream: Redis serves no one else while a script runs.
local function emit(grp, key_json, op, version, patch)
  local sid = format('%d', seq + 1)
  local msg = '{"seq":' .. sid .. ',"partition":' .. partition .. ',"section":' .. grp.section
    .. ',"key":' .. key_json .. ',"op":"' .. op .. '","version":' .. version
    .. ',"table":' .. grp.tbl .. ',"ts":"' .. ts .. '","patch":' .. patch .. '}'
  local r = pcall_redis(publish, grp.channel, msg)
  if type(r) == 'table' and r.err then
    return 'NOPERM cannot publish on ' .. grp.channel .. ': ' .. r.err
  end
  call('XADD', stream_key, 'MAXLEN', '~', maxlen, sid .. '-0', 'm', msg)
  seq = call('INCR', seq_key)
end

-- JSON text of the RFC 6901 path of a column that vanished from a row (the
-- only name Python could not quote for us): cjson quotes a string exactly, and
-- after ~ and / are escaped there is no '/' for it to write as '\/'
local function pointer(name)
  return '"/' .. sub(cjson.encode((name:gsub('~', '~0'):gsub('/', '~1'))), 2)
end

-- columns stored in doc that the new row lacks (rare: the table or the
-- configured columns changed), found only when HLEN says there are some
local function vanished(doc, shape, ops)
  local keep, gone = {}, {}
  for j = 1, #shape do keep[field[shape[j]]] = true end
  local flat = call('HGETALL', doc)
  for j = 1, #flat, 2 do
    local name = flat[j]
    if not keep[name] and byte(name, 1) ~= 64 then  -- 64: '@', meta fields
      ops[#ops + 1] = '{"op":"remove","path":' .. pointer(name) .. '}'
      gone[#gone + 1] = name
    end
  end
  return gone
end

-- a live document becomes a tombstone that keeps @v for fencing
local function delete(grp, doc, key_json, version, live)
  if live then
    problem = emit(grp, key_json, 'D', version, tombstone_patch)
    if problem then return end
    call('DEL', doc)
    call('SREM', grp.index, sub(doc, grp.plen + 1))
  end
  call('HSET', doc, '@v', version, '@del', '1')
  call('PEXPIRE', doc, ttl)
  return live and 'p' or 'a'
end

-- absent document or tombstone: the patch replaces the root
local function insert(grp, doc, key_json, op, version, shape, vbase, tombstone)
  local members, fields = {}, {'@v', version, '@ts', ts}
  for j = 1, #shape do
    local c, value = shape[j], ARGV[vbase + j]
    members[j] = jname[c] .. ':' .. value
    fields[3 + 2 * j], fields[4 + 2 * j] = field[c], value
  end
  problem = emit(grp, key_json, op == 'S' and 'S' or 'I', version,
    '[{"op":"replace","path":"","value":{' .. concat(members, ',') .. '}}]')
  if problem then return end
  if tombstone then call('DEL', doc) end
  call('HSET', doc, unpack(fields))
  call('SADD', grp.index, sub(doc, grp.plen + 1))
  return 'p'
end

-- live document: one operation per column that differs
local function update(grp, doc, key_json, op, version, shape, vbase, got)
  local ops, fields = {}, {'@v', version, '@ts', ts}
  local present = got[3] and 2 or 1  -- fields HMGET found: @v, maybe @ts, columns
  for j = 1, #shape do
    local c, value, old = shape[j], ARGV[vbase + j], got[3 + j]
    if old then present = present + 1 end
    if old ~= value then
      ops[#ops + 1] = '{"op":"' .. (old and 'replace' or 'add') .. '","path":' .. jpath[c]
        .. ',"value":' .. value .. '}'
      fields[#fields + 1] = field[c]
      fields[#fields + 1] = value
    end
  end
  local gone = call('HLEN', doc) > present and vanished(doc, shape, ops) or nil
  local status = 'a'
  if #ops > 0 then
    problem = emit(grp, key_json, op == 'S' and 'S' or 'U', version, '[' .. concat(ops, ',') .. ']')
    if problem then return end
    status = 'p'
  end
  call('HSET', doc, unpack(fields))
  if gone and #gone > 0 then call('HDEL', doc, unpack(gone)) end
  return status
end

local statuses = {}
local kbase = 3 + ngroups
for i = 1, #KEYS - kbase do
  local grp = groups[tonumber(ARGV[a])]
  local key_json, op, version = ARGV[a + 1], ARGV[a + 2], ARGV[a + 3]
  local reset = ARGV[a + 4] == '1'
  local h = tonumber(ARGV[a + 5])
  local shape, vbase = shapes[h], a + 5  -- value j of the row is ARGV[vbase + j]
  a = vbase + 1 + (shape and #shape or 0)

  local doc = KEYS[kbase + i]
  local got = call('HMGET', doc, unpack(reads[h]))  -- WRONGTYPE here: nothing written yet
  local old_v, deleted = got[1], got[2]
  local status
  if old_v and not reset and not newer(version, old_v) then
    status = 's'
  elseif shape == nil then
    status = delete(grp, doc, key_json, version, old_v and not deleted)
  elseif not old_v or deleted then
    status = insert(grp, doc, key_json, op, version, shape, vbase, old_v)
  else
    status = update(grp, doc, key_json, op, version, shape, vbase, got)
  end
  if problem then return redis.error_reply(problem) end
  statuses[i] = status
end

return {concat(statuses), format('%d', seq)}
