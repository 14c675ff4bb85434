#!lua
--[[
cdc-sync bulk_marker: the one message of a bulk snapshot per partition and
section ("op":"R"), telling subscribers to reload the section's documents
(publishers/bulk.py; DESIGN.md section 5). It takes one seq, like any
message, so seq stays gap-free: INCR, XADD <seq>-0, PUBLISH.

Atomic for the same reason as apply.lua's emit: @seq, the stream entry and
the message must not interleave with another call, or seq would gap.

KEYS[1] ns:{p}:@seq   KEYS[2] ns:{p}:@stream   KEYS[3] ns:{p}:@fence
ARGV[1] table as JSON text (its @fence field, as apply.lua)   ARGV[2] fencing token ("0": not fenced)
ARGV[3] the message without its seq: the text after '{"seq":N,'
ARGV[4] channel   ARGV[5] PUBLISH | SPUBLISH   ARGV[6] stream MAXLEN (approximate)

Errors, before anything is written: CDCLAYOUT (a shared key of the wrong
type, @seq not an integer, the stream ahead of @seq), FENCED, NOPERM (the
channel refused). Returns the message's seq as a decimal string.
--]]

local call = redis.call
local seq_key, stream_key, fence_key = KEYS[1], KEYS[2], KEYS[3]
local tbl, token, body, channel, publish, maxlen = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]

local function newer(a, b)
  if #a ~= #b then return #a > #b end
  return a > b
end
local function wrong(key, want)
  local t = call('TYPE', key)['ok']
  if t ~= 'none' and t ~= want then return key .. ' holds a ' .. t .. ', expected a ' .. want end
end
local problem = wrong(seq_key, 'string') or wrong(stream_key, 'stream') or wrong(fence_key, 'hash')
if problem then return redis.error_reply('CDCLAYOUT ' .. problem) end
local seq = tonumber(call('GET', seq_key) or '0')
if seq == nil then return redis.error_reply('CDCLAYOUT ' .. seq_key .. ' does not hold an integer') end
if call('EXISTS', stream_key) == 1 then
  local info = call('XINFO', 'STREAM', stream_key)
  for i = 1, #info, 2 do
    if info[i] == 'last-generated-id' then
      local top = tonumber(string.match(info[i + 1], '^(%d+)'))
      if top > seq then
        return redis.error_reply('CDCLAYOUT ' .. stream_key .. ' is ahead of ' .. seq_key)
      end
    end
  end
end
if token ~= '0' then
  local seen = call('HGET', fence_key, tbl) or '0'
  if newer(seen, token) then
    return redis.error_reply('FENCED ' .. tbl .. ' token ' .. token .. ' is below ' .. seen)
  end
end

local sid = string.format('%d', seq + 1)
local msg = '{"seq":' .. sid .. ',' .. body
local r = redis.pcall(publish, channel, msg)
if type(r) == 'table' and r.err then
  return redis.error_reply('NOPERM cannot publish on ' .. channel .. ': ' .. r.err)
end
call('XADD', stream_key, 'MAXLEN', '~', maxlen, sid .. '-0', 'm', msg)
call('INCR', seq_key)
return sid
