"""``redis.durability``: the apply calls' writes acknowledged by replicas.

Redis replicates asynchronously: a primary that dies takes with it what its
replicas had not received, and a checkpoint that passed those changes would
skip them for good. With ``replicas: N`` every round of apply calls ends
with ``WAIT N timeout`` on the connection that sent them (WAIT covers the
writes of its own connection), in the same round trip. Only when WAIT
reports N does the round count as applied: otherwise the batch fails with
``RedisUnavailable`` and the daemon retries it, so its tickets stay open and
no checkpoint passes it.

A retry of a batch whose calls did write on the old connection finds its
changes stale and writes nothing, so its WAIT would cover nothing of the
writes still unacknowledged. After a WAIT that fell short (or a round that
failed on the way), the next WAIT is preceded on its connection by a write
of ``ns:{p}:@wait`` (``PX 60000``): WAIT then covers the replication stream
up to that marker, the earlier writes included.

WAITAOF (Redis 7.2+: the write is in the AOF of the primary and of N
replicas) is not used: the servers this is built and tested with are Redis
7.0, which lacks it, and WAIT is what a failover needs (a promoted replica
has what it acknowledged, from memory).
"""

from __future__ import annotations

from typing import Any

from publishers.errors import RedisUnavailable
from publishers.layout import Layout
from publishers.settings import Durability


class Acknowledgements:
    """Appends the WAIT (and the marker when needed) to a round's commands,
    and judges its reply."""

    def __init__(self, durability: Durability, layout: Layout) -> None:
        self.replicas = durability.replicas
        self.timeout_ms = max(1, round(durability.timeout * 1000))
        self.layout = layout
        self._unconfirmed = False  # a round's writes may be on the primary and not on N replicas

    @property
    def on(self) -> bool:
        return self.replicas > 0

    def commands(self, partition: str) -> list[tuple[Any, ...]]:
        """What follows a round's calls on their connection; ``partition`` is
        one of theirs (on a cluster the marker must be in the node's slots).
        Every round is unconfirmed until ``settle`` says otherwise."""
        wait = ("WAIT", self.replicas, self.timeout_ms)
        marker = ("SET", self.layout.wait_marker(partition), "1", "PX", 60_000)
        commands = [marker, wait] if self._unconfirmed else [wait]
        self._unconfirmed = True
        return commands

    def settle(self, replies: list[Any]) -> None:
        """The replies to ``commands``: WAIT's count is the last. Fewer than
        N replicas: ``RedisUnavailable`` (retry the batch, hold the checkpoint)."""
        self.judge(replies)
        self._unconfirmed = False

    def marked(self, marker: str) -> list[tuple[Any, ...]]:
        """A marker write then WAIT: for a connection whose own writes may all
        have been no-ops (a Redis Cluster node's, ``publishers.cluster_wait``)."""
        return [("SET", marker, "1", "PX", 60_000), ("WAIT", self.replicas, self.timeout_ms)]

    def judge(
        self, replies: list[Any], what: str = "the apply calls", then: str = "the batch is retried"
    ) -> None:
        """``settle`` without state: raises unless WAIT (the last reply) counted
        N; ``what`` was waited for, ``then`` what the caller does about it."""
        for reply in replies[:-1]:
            if isinstance(reply, BaseException):
                raise RedisUnavailable(f"the marker before WAIT failed: {reply}")
        acknowledged = replies[-1]
        if isinstance(acknowledged, BaseException):
            raise RedisUnavailable(f"WAIT failed: {acknowledged}")
        if int(acknowledged) < self.replicas:
            raise RedisUnavailable(
                f"{int(acknowledged)} of {self.replicas} replicas acknowledged {what} within "
                f"{self.timeout_ms} ms (redis.durability): {then}, its checkpoint held"
            )
