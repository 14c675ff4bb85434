-- cdc-sync lease_acquire: take a table's lease, or keep ours, and hand out
-- its fencing token (publishers/leases.py, Leases.acquire).
--
-- KEYS[1]  ns:@lease:{table}   string: owner id, with a TTL
-- KEYS[2]  ns:@fence:{table}   string: the table's fencing counter
-- ARGV[1]  owner id
-- ARGV[2]  lease TTL in ms
-- ARGV[3]  the counter's floor: the caller's clock in ms
--
-- Returns the new fencing token when the lease was free, the current one when
-- it is already ours (its TTL renewed), false when another owner holds it.
--
-- Atomic so that taking the lease and incrementing the counter cannot be
-- separated: every new owner gets a token above every earlier owner's. Both
-- keys share the {table} hash tag, so this holds on a cluster too. A counter
-- that is gone (Redis restarted empty) or went back (a failover to a replica
-- that lacked its last increments, without redis.durability) is raised to the
-- clock first: tokens are about the clock in ms (one lease taken a ms at most),
-- so a token handed out before is below it, and no partition's @fence that
-- recorded one refuses the new owner (a cluster run without durability was
-- FENCED by its own earlier token, a document missing at the end).
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local current = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
  if current < tonumber(ARGV[3]) then
    redis.call('SET', KEYS[2], ARGV[3])
  end
  return redis.call('INCR', KEYS[2])
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return tonumber(redis.call('GET', KEYS[2]) or '0')
end
return false
