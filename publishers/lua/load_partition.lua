#!lua flags=no-writes
-- cdc-sync load_partition: a subscriber's consistent first read of a
-- partition (publishers/subscriber.py, Subscriber._load_sections).
--
-- KEYS[1]    ns:{p}:@seq
-- KEYS[2]    ns:{p}:@stream
-- KEYS[2+s]  ns:{p}:@index:section of section s       (s = 1..S)
-- ARGV[s]    ns:{p}:section: the document key prefix of section s
--
-- Returns {seq, the stream message at seq (or false), then per section
-- {key, hash, key, hash, ...}} (a hash as HGETALL's flat field/value list).
--
-- Atomic so that seq and the documents agree: the replica then follows on
-- from the stream at seq + 1 without a gap or a change applied twice. It
-- reads document keys named by the index, which it cannot declare in
-- advance; they share the partition's {p} hash tag, so on a cluster they live
-- in the slot of KEYS. The shebang line must stay first: no-writes declares
-- the script read-only (Redis 7), so Redis may run it where writes are refused.
local seq = redis.call('GET', KEYS[1]) or '0'
local entry = redis.call('XRANGE', KEYS[2], seq .. '-0', seq .. '-0')[1]
local out = {seq, entry and entry[2][2] or false}
for s = 3, #KEYS do
  local members = redis.call('SMEMBERS', KEYS[s])
  local docs = {}
  for i = 1, #members do
    docs[2 * i - 1] = members[i]
    docs[2 * i] = redis.call('HGETALL', ARGV[s - 2] .. members[i])
  end
  out[s] = docs
end
return out
