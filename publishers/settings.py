"""The Redis settings that the data manager and the subscriber are built from.

Owned by ``publishers`` (which imports nothing from ``cdc``) so that an
application can build one by hand; ``cdc.config`` builds it from the
``redis:`` section of the config file, durations already in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SentinelConfig:
    """Reach the primary through Redis Sentinel (``redis.sentinel``).

    ``nodes`` are the sentinels' (host, port); ``url`` says how to talk to
    them: ``rediss://`` for TLS, ``user:password@`` for their ACL, no host
    (the nodes give it). The primary's own scheme, user, password and
    database stay in ``RedisConfig.url``, without a host either."""

    master: str
    nodes: tuple[tuple[str, int], ...]
    url: str = field(default="redis://", repr=False)  # may hold a password


@dataclass(frozen=True)
class Durability:
    """``redis.durability``: after each apply call, ``WAIT replicas timeout``
    on the connection that made it; the checkpoint passes the call's changes
    only once that many replicas acknowledged them (``publishers.durability``).
    ``replicas = 0`` sends no WAIT."""

    replicas: int = 0
    timeout: float = 1.0  # seconds


@dataclass(frozen=True)
class RedisConfig:
    url: str = field(default="redis://127.0.0.1:6379/0", repr=False)  # may hold a password
    cluster: bool = False
    namespace: str = "cdc"
    stream_max_len: int = 100_000
    tombstone_ttl: float = 7 * 86400.0  # seconds
    sentinel: SentinelConfig | None = None
    durability: Durability = field(default_factory=Durability)
    # with cluster: more nodes to find the cluster by when the url's does not answer
    cluster_nodes: tuple[tuple[str, int], ...] = ()
