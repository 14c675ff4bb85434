"""The ``redis:`` section built into a ``RedisConfig``, with the checks a
schema cannot say: the URL's database (``cdc.config_addresses``), a sentinel
form whose URLs name no host (the sentinels name the primary), sentinel and
cluster not both. Each error is a FieldError naming the field; no message
quotes a URL, which may hold a password.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from cdc.config_addresses import check_redis_url, parse_health_address
from cdc.config_schema import NOT_SHOWN
from cdc.config_yaml import FieldError, Path
from publishers.settings import Durability, RedisConfig, SentinelConfig

Duration = Callable[[Any, tuple[str | int, ...]], float]
SENTINEL_URL = "redis://"  # the default: plain TCP, no password


def build_redis(redis: Mapping[str, Any], duration: Duration) -> RedisConfig:
    """``redis`` (the section as validated by the schema) as a ``RedisConfig``."""
    _check_url(redis)
    sentinel = _sentinel(redis)
    return RedisConfig(
        url=redis.get("url", "redis:///0" if sentinel else RedisConfig.url),
        cluster=redis.get("cluster", False),
        namespace=redis.get("namespace", "cdc"),
        stream_max_len=redis.get("stream_max_len", 100_000),
        tombstone_ttl=duration(redis.get("tombstone_ttl", "7d"), ("redis", "tombstone_ttl")),
        sentinel=sentinel,
        durability=_durability(redis.get("durability"), duration),
        cluster_nodes=_cluster_nodes(redis),
    )


def _cluster_nodes(redis: Mapping[str, Any]) -> tuple[tuple[str, int], ...]:
    nodes = redis.get("cluster_nodes") or []
    if nodes and not redis.get("cluster", False):
        raise FieldError(
            ("redis", "cluster_nodes"),
            "cluster_nodes are nodes of a Redis Cluster: set cluster: true, or remove them",
        )
    return tuple(_node(node, ("redis", "cluster_nodes", i), "a node") for i, node in enumerate(nodes))


def _check_url(redis: Mapping[str, Any]) -> None:
    if "url" not in redis:
        return
    try:
        check_redis_url(redis["url"], cluster=redis.get("cluster", False))
    except ValueError as exc:
        raise FieldError(("redis", "url"), f"{exc}; {NOT_SHOWN}") from None


def _sentinel(redis: Mapping[str, Any]) -> SentinelConfig | None:
    sentinel = redis.get("sentinel")
    if sentinel is None:
        return None
    if redis.get("cluster", False):
        raise FieldError(
            ("redis", "sentinel"),
            "a Redis Cluster fails over by itself: give either sentinel or cluster: true",
        )
    if "url" in redis:
        _hostless(redis["url"], ("redis", "url"), "the primary's scheme, user, password and database")
    url = sentinel.get("url", SENTINEL_URL)
    _hostless(url, ("redis", "sentinel", "url"), "the sentinels' scheme, user and password")
    if urlsplit(url).path not in ("", "/"):
        raise FieldError(
            ("redis", "sentinel", "url"), f"a sentinel has no database: end the URL at the @; {NOT_SHOWN}"
        )
    nodes = tuple(
        _node(node, ("redis", "sentinel", "nodes", i), "a sentinel")
        for i, node in enumerate(sentinel["nodes"])
    )
    return SentinelConfig(master=sentinel["master"], nodes=nodes, url=url)


def _hostless(url: str, where: tuple[str, ...], what: str) -> None:
    """With sentinel, a URL says how to talk, not where: the nodes and the
    sentinels' answer say where. A host given would be ignored in silence."""
    if url.startswith("unix://"):
        raise FieldError(
            where, f"the sentinels name the primary by host and port: no unix:// URL; {NOT_SHOWN}"
        )
    try:
        parts = urlsplit(url)
        named = bool(parts.hostname) or parts.port is not None
    except ValueError:
        named = True
    if named:
        raise FieldError(
            where,
            f"with redis.sentinel this URL gives {what} only, no host or port (the sentinels name "
            f"the primary; sentinel.nodes the sentinels), as in rediss://user:${{PASSWORD}}@/0; {NOT_SHOWN}",
        )


def _node(value: str, where: Path, what: str) -> tuple[str, int]:
    try:
        host, port = parse_health_address(value)
    except ValueError as exc:
        raise FieldError(where, str(exc)) from None
    if port == 0:
        raise FieldError(where, f"{what}'s port cannot be 0")
    return host, port


def _durability(durability: Mapping[str, Any] | None, duration: Duration) -> Durability:
    if durability is None:
        return Durability()
    timeout = duration(durability.get("timeout", "1s"), ("redis", "durability", "timeout"))
    return Durability(replicas=durability["replicas"], timeout=timeout)
