--[[ A consumer acknowledges entries it handled (docs/CONSUMERS.md), atomic
with the owner check and its document's count: each only if it still holds
it (a consumer presumed dead lost its entries to another: acknowledging
theirs would drop work). The entry's document has one pending entry fewer;
at none it has no holder.

KEYS[1] ns:{p}:@stream   KEYS[2] ns:{p}:@group:g:holders   KEYS[3] ns:{p}:@group:g:docs
ARGV[1] group   ARGV[2] consumer   ARGV[3..] entry ids
Returns one integer per id: 1 acknowledged, 0 not pending (already
acknowledged), -1 held by another consumer now.
]]

local stream, holders, docs = KEYS[1], KEYS[2], KEYS[3]
local group, me = ARGV[1], ARGV[2]
local call = redis.call
local out = {}
for i = 3, #ARGV do
  local id = ARGV[i]
  local p = call('XPENDING', stream, group, id, id, 1)
  if not p[1] then
    out[#out + 1] = 0
  elseif p[1][2] ~= me then
    out[#out + 1] = -1
  else
    call('XACK', stream, group, id)
    local doc = call('HGET', docs, id)
    if doc then
      call('HDEL', docs, id)
      local v = call('HGET', holders, doc)
      local n, who = string.match(v or '', '^(%d+) (.*)$')
      if n and tonumber(n) > 1 then
        call('HSET', holders, doc, (tonumber(n) - 1) .. ' ' .. who)
      else
        call('HDEL', holders, doc)
      end
    end
    out[#out + 1] = 1
  end
end
return out
