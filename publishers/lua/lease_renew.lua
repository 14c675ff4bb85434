-- cdc-sync lease_renew: extend a lease if it is still ours
-- (publishers/leases.py, Leases.renew_all).
--
-- KEYS[1]  ns:@lease:{table}   string: owner id, with a TTL
-- ARGV[1]  owner id
-- ARGV[2]  lease TTL in ms
--
-- Returns 1 when renewed, 0 when the lease is no longer ours (expired, taken).
--
-- Atomic so that the owner check and the PEXPIRE cannot be split: otherwise
-- a lease that expired and was taken between them would be extended for its
-- new owner by the old one.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
