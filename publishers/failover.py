"""Telling that the primary behind ``redis.sentinel`` changed, and what to do.

A primary's replication id (``INFO replication`` ``master_replid``) is new
whenever a replica is promoted (it keeps the old one as ``master_replid2``)
and when a server restarts without an RDB to read it from. The sidecar reads
it every lease round (``cdc.balancer``); a change while it runs means the
data it writes to now is another server's copy, which may lack what the old
primary acknowledged and had not replicated:

- with ``redis.durability`` every apply call was acknowledged by the
  replicas before its checkpoint could pass it, so nothing the checkpoints
  stand for is missing: the failover is logged, nothing re-read;
- without it, the last writes may be gone while the checkpoints (read back
  from the same copy, or held in memory) passed them: every table the
  sidecar owns is snapshotted again, the path a Redis restarted empty takes
  (documents rewritten, an ``R`` per partition: subscribers reload, a sweep
  of what is gone).

Only with ``redis.sentinel``: a single server's id also changes when it
restarts from its AOF alone, which loses nothing.
"""

from __future__ import annotations

from publishers import redis_calls
from publishers.manager import DataManager


async def replication_id(manager: DataManager) -> str:
    """The primary's ``master_replid`` (empty when the server does not say)."""
    info = await redis_calls.call(manager.client.info("replication"), manager.config.url)
    return str(info.get("master_replid", ""))


def watched(manager: DataManager) -> bool:
    """Whether failovers are looked for: behind sentinels only (above)."""
    return manager.config.sentinel is not None


def repair_needed(manager: DataManager) -> bool:
    """Without ``redis.durability`` a failover may have lost acknowledged writes."""
    return manager.config.durability.replicas == 0
