--[[ A consumer runs an entry again after its handler failed (docs/CONSUMERS.md).
Atomic with the owner check: XCLAIM to itself counts one more delivery, so
that a message that fails (or kills its consumer) N times reaches the dead
letter, even across crashes.

KEYS[1] ns:{p}:@stream   ARGV[1] group   ARGV[2] consumer   ARGV[3] entry id
Returns the entry's delivery count, or -1 when another consumer holds it now
(or it is no longer pending).
]]

local stream, group, me, id = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
local p = redis.call('XPENDING', stream, group, id, id, 1)
if not p[1] or p[1][2] ~= me then return -1 end
-- JUSTID alone would leave the count as it is; RETRYCOUNT sets it
redis.call('XCLAIM', stream, group, me, 0, id, 'RETRYCOUNT', p[1][4] + 1, 'JUSTID')
return p[1][4] + 1
