-- cdc-sync field_clear: remove a hash field if it still holds a value
-- (publishers/control.py: a snapshot request once its snapshot is done).
--
-- KEYS[1]  the hash (ns:@checkpoint:table)
-- ARGV[1]  the field (snapshot_requested, snapshot_range)
-- ARGV[2]  the value it held when the work it asks for began
--
-- Returns 1 when removed, 0 when the field holds another value or none.
--
-- Atomic so that the compare and the HDEL cannot be split: a request made
-- while the snapshot ran (another value) must outlive it, or it was lost.
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  return redis.call('HDEL', KEYS[1], ARGV[1])
end
return 0
