--[[ A consumer of a group takes work from one partition's stream, atomically
(every key shares the partition's {p} hash tag). docs/CONSUMERS.md.

The rule it keeps: every pending entry of one document (section + key) is
held by one consumer, the document's holder, so that consumer runs them in
seq order. An entry read for a document another live consumer holds is
handed to that holder (XCLAIM JUSTID + its inbox), never run here.

KEYS[1] ns:{p}:@stream
KEYS[2] ns:{p}:@group:g:holders  hash  document -> "<pending count> <consumer>"
KEYS[3] ns:{p}:@group:g:docs     hash  pending entry id -> document
KEYS[4] ns:{p}:@group:g:inbox    zset  "<consumer>\0<seq, 20 digits>", score 0: entries handed to
                                        a holder (zero-padded: the lexical order is the seq order)
KEYS[5] ns:{p}:@group:g:alive    hash  consumer -> when it is presumed dead (Redis TIME, ms)
KEYS[6] ns:{p}:@seq              the partition's last seq (apply.lua moves it with each XADD)
ARGV[1] group   ARGV[2] consumer   ARGV[3] how many entries to take at most
ARGV[4] liveness TTL (ms)   ARGV[5] 1 if this consumer was registered here before
ARGV[6] sections wanted, each as JSON text, separated by "\n" ("": all)
ARGV[7] 1 to take this consumer's own pending entries again: its first take
        (a restarted process of the same name), or after a take whose reply
        was lost (a dropped connection)

Returns {entries, lost, reaped, last}: entries a flat list of
id, message, delivery count; lost a flat list of "first-last" seq ranges
(or single ids) the stream no longer holds; reaped 1 when this consumer had
been presumed dead and its entries taken by others; last the group's
last-delivered seq.
]]

local stream, holders, docs, inbox, alive = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local group, me, room, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local call = redis.call

-- the stream deleted (Redis restarted empty, FLUSHALL, DEL): the group went
-- with it; nothing is written into a partition that is not there
if call('EXISTS', stream) == 0 then
  return redis.error_reply('NOGROUP the stream ' .. stream .. ' does not exist')
end

local t = call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local reaped = 0
if ARGV[5] == '1' and call('HEXISTS', alive, me) == 0 then reaped = 1 end
call('HSET', alive, me, now + ttl)

local wanted = nil
if ARGV[6] ~= '' then
  wanted = {}
  for s in string.gmatch(ARGV[6], '[^\n]+') do wanted[s] = true end
end

local out, lost = {}, {}

-- the end of the JSON string that starts at i (the index of its closing quote)
local function string_end(s, i)
  local j = i + 1
  while true do
    local k = string.find(s, '["\\]', j)
    if not k then return nil end
    if string.sub(s, k, k) == '"' then return k end
    j = k + 2
  end
end

-- section and key of a message as their JSON texts. Messages are spliced by
-- apply.lua and bulk_marker.lua in one order: {"seq":N,"partition":P,"section":S,"key":K,...
local function section_key(msg)
  local p = string.find(msg, ',"partition":"', 1, true)
  if not p then return nil end
  local pe = string_end(msg, p + 13)
  local s = pe and pe + 12
  if not s or string.sub(msg, pe + 1, s) ~= ',"section":"' then return nil end
  local se = string_end(msg, s)
  if not se or string.sub(msg, se + 1, se + 7) ~= ',"key":' then return nil end
  local ke = string_end(msg, se + 8)
  if not ke then return nil end
  return string.sub(msg, s, se), string.sub(msg, se + 8, ke)
end

local function holder_of(doc)
  local v = call('HGET', holders, doc)
  if not v then return nil, 0 end
  local n, who = string.match(v, '^(%d+) (.*)$')
  return who, tonumber(n)
end

-- an entry leaves the pending list: one fewer for its document's holder
local function release(id)
  local doc = call('HGET', docs, id)
  if not doc then return end
  call('HDEL', docs, id)
  local who, n = holder_of(doc)
  if who and n > 1 then
    call('HSET', holders, doc, (n - 1) .. ' ' .. who)
  else
    call('HDEL', holders, doc)
  end
end

local function seq_of(id) return tonumber(string.match(id, '^(%d+)')) end

-- a consumer's pending entries, all at once (so that no document's entries
-- are split between two holders), become this consumer's, with one more
-- delivery each; a dead consumer then leaves the group
local function reap(owner)
  local pending = call('XPENDING', stream, group, '-', '+', 1000000, owner)
  for i = 1, #pending, 500 do
    local ids, counts = {}, {}
    for j = i, math.min(i + 499, #pending) do
      ids[#ids + 1] = pending[j][1]
      counts[pending[j][1]] = pending[j][4]
    end
    local got = call('XCLAIM', stream, group, me, 0, unpack(ids))
    local present = {}
    for _, e in ipairs(got) do
      local id, msg = e[1], e[2][2]
      present[id] = true
      local doc = call('HGET', docs, id)
      if doc then
        local _, n = holder_of(doc)
        call('HSET', holders, doc, n .. ' ' .. me)
      end
      out[#out + 1] = id; out[#out + 1] = msg; out[#out + 1] = counts[id] + 1
    end
    for _, id in ipairs(ids) do
      if not present[id] then release(id); lost[#lost + 1] = id end  -- trimmed: XCLAIM dropped it
    end
  end
  call('ZREMRANGEBYLEX', inbox, '[' .. owner .. '\0', '(' .. owner .. '\1')
  if owner ~= me then
    call('HDEL', alive, owner)
    call('XGROUP', 'DELCONSUMER', stream, group, owner)
  end
end

if ARGV[7] == '1' then reap(me) end

local everyone = call('HGETALL', alive)
for i = 1, #everyone, 2 do
  if everyone[i] ~= me and tonumber(everyone[i + 1]) < now then reap(everyone[i]) end
end

-- entries other consumers handed to this one
local handed = call('ZRANGEBYLEX', inbox, '[' .. me .. '\0', '(' .. me .. '\1', 'LIMIT', 0, math.max(room, 0))
for _, member in ipairs(handed) do
  call('ZREM', inbox, member)
  local id = string.match(string.sub(member, #me + 2), '^0*(%d+)$') .. '-0'
  local e = call('XRANGE', stream, id, id)
  if #e == 1 then
    local p = call('XPENDING', stream, group, id, id, 1)
    out[#out + 1] = id; out[#out + 1] = e[1][2][2]; out[#out + 1] = (p[1] and p[1][4]) or 1
  else
    call('XACK', stream, group, id); release(id); lost[#lost + 1] = id
  end
end

-- the group's last-delivered seq (XINFO GROUPS: a flat field list per group)
local last = 0
for _, g in ipairs(call('XINFO', 'GROUPS', stream)) do
  local info = {}
  for i = 1, #g, 2 do info[g[i]] = g[i + 1] end
  if info['name'] == group then last = seq_of(info['last-delivered-id']) end
end

room = math.floor(room - #out / 3)
if room > 0 then
  local reply = call('XREADGROUP', 'GROUP', group, me, 'COUNT', room, 'STREAMS', stream, '>')
  local entries = (reply and reply[1] and reply[1][2]) or {}
  local first = entries[1] and seq_of(entries[1][1])
  if not first then  -- nothing new: were the entries after `last` trimmed away unread?
    local seq = tonumber(call('GET', KEYS[6]) or '0')
    if seq > last then
      first = seq + 1
      call('XGROUP', 'SETID', stream, group, seq .. '-0')
    end
  end
  if first and first > last + 1 then lost[#lost + 1] = (last + 1) .. '-' .. (first - 1) end
  for _, e in ipairs(entries) do
    local id, msg = e[1], e[2][2]
    last = seq_of(id)
    local section, key = section_key(msg)
    if wanted and section and not wanted[section] then
      call('XACK', stream, group, id)  -- another section's message: not this group's work
    else
      local doc = (section or '') .. (key or id)  -- unparsable: a document of its own
      local who, n = holder_of(doc)
      who = who or me
      call('HSET', holders, doc, (n + 1) .. ' ' .. who)
      call('HSET', docs, id, doc)
      if who == me then
        out[#out + 1] = id; out[#out + 1] = msg; out[#out + 1] = 1
      else
        call('XCLAIM', stream, group, who, 0, id, 'JUSTID')
        call('ZADD', inbox, 0, who .. '\0' .. string.format('%020d', last))
      end
    end
  end
end

return {out, lost, reaped, last}
