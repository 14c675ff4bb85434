-- cdc-sync lease_release: give a lease up if it is still ours
-- (publishers/leases.py, Leases.release).
--
-- KEYS[1]  ns:@lease:{table}   string: owner id, with a TTL
-- ARGV[1]  owner id
-- ARGV[2]  lease TTL in ms (unused; every lease script gets owner and TTL)
--
-- Returns 1 when deleted, 0 when the lease was not ours.
--
-- Atomic so that the owner check and the DEL cannot be split: otherwise a
-- lease taken over in between would be deleted under its new owner.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
