"""Telling that Redis failed over to another primary, and what to do.

Behind ``redis.sentinel``: a primary's replication id (``INFO replication``
``master_replid``) is new whenever a replica is promoted (it keeps the old
one as ``master_replid2``) and when a server restarts without an RDB to read
it from. On a Redis Cluster (``cluster: true``): a node that served slots as
a primary no longer does (``CLUSTER NODES``), its slots taken over by a
promoted replica (a SIGKILLed primary after the node timeout, or a manual
``CLUSTER FAILOVER``); a primary added by a scale-out is no failover. The
sidecar looks every lease round (``cdc.balancer``); a failover while it runs
means that part of the data it writes to is now another server's copy, which
may lack what the old primary acknowledged and had not replicated:

- with ``redis.durability`` every write whose loss matters was acknowledged
  by the replicas before its checkpoint could pass it, so nothing the
  checkpoints stand for is missing: the failover is logged, nothing re-read;
- without it, the last writes may be gone while the checkpoints (read back
  from the same copy, or held in memory) passed them: every table the
  sidecar owns is snapshotted again, the path a Redis restarted empty takes
  (documents rewritten, an ``R`` per partition: subscribers reload, a sweep
  of what is gone). On a cluster every owned table, not only those with a
  partition on the failed-over shard: a table's partitions spread over every
  shard by their hash, so nearly every table has one there, and its
  checkpoint may be there too.

Only with ``redis.sentinel`` or a cluster: a single server's id also changes
when it restarts from its AOF alone, which loses nothing.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from redis import exceptions as rex
from redis.asyncio.cluster import RedisCluster

from publishers import redis_calls
from publishers.manager import DataManager

log = logging.getLogger("cdc.failover")

# Seconds a cluster node has to answer CLUSTER NODES. The client asks a node
# at random, and one that does not answer (a replica SIGSTOPped) would hold
# the lease round, renewals included, for the socket's 60 s: the leases run
# out and the tables stay unowned that long (a suspect in a CI failure of
# the not-durable cluster failover; docs/RELIABILITY.md).
VIEW_TIMEOUT = 2.0
_VIEW_ERRORS: tuple[type[BaseException], ...] = (TimeoutError, *redis_calls.REDIS_ERRORS)


class FailoverWatch:
    """What ``check`` compares with: the primary's replication id (Sentinel)
    or the ids of the cluster nodes serving slots as primaries, with the
    highest config epoch among them (a failover raises it)."""

    def __init__(self, manager: DataManager) -> None:
        self.manager = manager
        self._seen: frozenset[str] = frozenset()
        self._epoch = 0
        self._refused = False  # CLUSTER NODES denied by the ACL (said once)

    @property
    def watched(self) -> bool:
        """Failovers are looked for behind sentinels and on a cluster (above)."""
        return self.manager.config.sentinel is not None or isinstance(self.manager.client, RedisCluster)

    @property
    def repair_needed(self) -> bool:
        """Without ``redis.durability`` a failover may have lost acknowledged writes."""
        return self.manager.config.durability.replicas == 0

    async def start(self) -> None:
        if self.watched:
            self._seen, self._epoch = await self._primaries()

    async def check(self) -> str | None:
        """A failover since the last check (or ``start``): what changed; else None.

        A cluster node answers from its own view, which gossip updates: a
        view with a lower epoch than one already read is older and skipped
        (else a node still listing the dead primary, then an updated one,
        would count the same failover twice: seen in 1 run of 2)."""
        if not self.watched:
            return None
        current, epoch = await self._primaries()
        if not current or epoch < self._epoch:
            return None  # the server did not say, or an older view
        gone = sorted(self._seen - current)
        previous, self._seen, self._epoch = self._seen, current, epoch
        if not previous or not gone:
            return None
        if isinstance(self.manager.client, RedisCluster):
            return f"cluster node(s) {', '.join(gone)} no longer primary; primaries now {', '.join(sorted(current))}"
        return f"replication id {', '.join(sorted(current))} (was {', '.join(gone)})"

    async def _primaries(self) -> tuple[frozenset[str], int]:
        client, url = self.manager.client, self.manager.config.url
        if isinstance(client, RedisCluster):
            try:  # read-only: abandoning it is harmless
                async with asyncio.timeout(VIEW_TIMEOUT):
                    nodes = await client.cluster_nodes()
            except rex.NoPermissionError as exc:
                self._tell_refused(exc)
                return frozenset(), 0
            except _VIEW_ERRORS:
                return frozenset(), 0  # no view this round: the next asks another node
            return serving_primaries(nodes)
        info = await redis_calls.call(client.info("replication"), url)
        replid = str(info.get("master_replid", ""))
        return frozenset([replid] if replid else []), 0

    def _tell_refused(self, exc: rex.NoPermissionError) -> None:
        """Said once: an ACL that denies CLUSTER NODES hides every failover."""
        if not self._refused:
            self._refused = True
            log.error(
                "the Redis ACL user may not run CLUSTER NODES: failovers are not seen, so without "
                "redis.durability what a failover loses is not repaired; allow +cluster|nodes "
                "(cdc doctor checks it)",
                extra={"error": str(exc)},
            )


def serving_primaries(nodes: dict[str, Any]) -> tuple[frozenset[str], int]:
    """The ids of the nodes that own slots as primaries in a parsed ``CLUSTER
    NODES``, and the highest config epoch among them. Two nodes may claim a
    slot in one view (a failed primary keeps its slots there until a replica
    is promoted; a killed primary restarted believes in its old slots until
    it hears of the new owner): as in Redis, the higher config epoch owns it."""
    owners: list[tuple[int, str] | None] = [None] * 16384
    claims = [
        (int(node.get("epoch", 0) or 0), str(node["node_id"]), node.get("slots") or [])
        for node in nodes.values()
        if "master" in str(node.get("flags", ""))
    ]
    for epoch, node_id, ranges in sorted(claims):
        for bounds in ranges:
            first, last = int(bounds[0]), int(bounds[-1])
            owners[first : last + 1] = [(epoch, node_id)] * (last - first + 1)
    owning = {owner for owner in owners if owner is not None}
    return frozenset(node_id for _, node_id in owning), max((epoch for epoch, _ in owning), default=0)
