"""Building the Redis client.

``create_client`` / ``connect`` give a client for a ``RedisConfig``; failing to
reach Redis at start-up is a ``ConnectError`` (exit code 3). Every command
sent afterwards goes through ``publishers.redis_calls``, which maps redis-py
errors onto ``publishers.errors``; URLs may carry an ACL password
(``redis://user:secret@host``), which ``publishers.redaction`` keeps out of
every message.
"""

from __future__ import annotations

import re
from typing import Any, TypeAlias

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import AbstractConnection, SSLConnection, UnixDomainSocketConnection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.typing import EncodableT

from publishers import redis_calls
from publishers.errors import ConnectError
from publishers.packing import pack as _pack
from publishers.redaction import for_display, scrub_url
from publishers.redis_calls import SOCKET_TIMEOUT
from publishers.sentinel import sentinel_client
from publishers.settings import RedisConfig, SentinelConfig

RedisClient: TypeAlias = "aioredis.Redis | RedisCluster"

CONNECT_TIMEOUT = 10.0
# redis-py's MasterNotFoundError quotes each sentinel's client (a 1,000-character
# repr, passwords already <REDACTED>) before that sentinel's error: keep the error.
_CLIENT_REPR = re.compile(r"<redis\.asyncio\.client\.Redis\(.*?\)>\)>\)> - ")


class HiredisConnection(aioredis.Connection):
    def pack_command(self, *args: EncodableT) -> list[bytes]:
        return _pack(args) or super().pack_command(*args)


class HiredisSSLConnection(SSLConnection):
    def pack_command(self, *args: EncodableT) -> list[bytes]:
        return _pack(args) or super().pack_command(*args)


class HiredisUnixConnection(UnixDomainSocketConnection):
    def pack_command(self, *args: EncodableT) -> list[bytes]:
        return _pack(args) or super().pack_command(*args)


_FAST: dict[type[AbstractConnection], type[AbstractConnection]] = {
    aioredis.Connection: HiredisConnection,
    SSLConnection: HiredisSSLConnection,
    UnixDomainSocketConnection: HiredisUnixConnection,
}


def use_hiredis_packing(client: RedisClient) -> None:
    """Make the client's new connections pack commands with hiredis.

    The connection class is a plain attribute of the pool (single server) and
    of every cluster node, read when a connection is made; if a redis-py
    release moves it, nothing breaks, commands are packed the slow way.
    """
    if isinstance(client, RedisCluster):
        holders: list[Any] = [*client.startup_nodes, *client.get_nodes()]
        kwargs = client.get_connection_kwargs()
        kwargs["connection_class"] = _FAST.get(kwargs.get("connection_class"), kwargs.get("connection_class"))  # type: ignore[arg-type]
    else:
        holders = [client.connection_pool]
    for holder in holders:
        current = getattr(holder, "connection_class", None)
        if current in _FAST:
            holder.connection_class = _FAST[current]


def create_client(config: RedisConfig) -> RedisClient:
    """A client for ``config.url`` (not yet connected).

    ``redis://``, ``rediss://`` (TLS) and ``unix://`` URLs, ACL user and
    password in the URL; ``cluster: true`` gives a ``RedisCluster`` that
    discovers the other nodes from the one named; ``sentinel`` a client of
    the primary the sentinels name (``publishers.sentinel``). Replies stay
    bytes: values are JSON text that we hand to orjson as they are.
    """
    options: dict[str, Any] = {
        "decode_responses": False,
        "socket_connect_timeout": CONNECT_TIMEOUT,
        "socket_timeout": SOCKET_TIMEOUT,
        "health_check_interval": 30,
    }
    if config.cluster and config.url.startswith("unix://"):
        raise ConnectError(f"Redis Cluster cannot be reached over a unix socket: {for_display(config.url)}")
    if config.sentinel is not None:
        sentinel = config.sentinel
        return redis_calls.build(lambda: sentinel_client(config.url, sentinel, options), config.url)
    if config.cluster:
        # No retry inside the cluster client: on a connection error its pipeline
        # closes the whole client before retrying (redis-py 8.1), every node's
        # connections included, under the commands other tasks have in flight
        # (a SIGKILLed primary: unclosed sockets, "Event loop is closed" out of
        # a DEL). The daemon retries (RedisUnavailable); the client reads the
        # slot map again before its next command.
        options["retry"] = Retry(NoBackoff(), 0)
    if config.cluster_nodes:  # tried first, the url's node last (redis-py's order): any one that answers
        options["startup_nodes"] = [ClusterNode(host, port) for host, port in config.cluster_nodes]
    client: RedisClient = redis_calls.build(
        lambda: (RedisCluster if config.cluster else aioredis.Redis).from_url(config.url, **options),
        config.url,
    )
    use_hiredis_packing(client)
    return client


async def connect(config: RedisConfig) -> RedisClient:
    """A client that has answered PING; ``ConnectError`` (exit code 3) if not."""
    client = create_client(config)
    try:
        await redis_calls.connected(client.ping(), config.url)
    except ConnectError as exc:
        await close_client(client)
        if config.sentinel is None:
            raise
        raise ConnectError(
            scrub_url(f"{exc} ({via_sentinels(config.sentinel)})", config.sentinel.url)
        ) from None
    return client


def via_sentinels(sentinel: SentinelConfig) -> str:
    """The sentinels, as errors name them (their password masked)."""
    nodes = ", ".join(f"{host}:{port}" for host, port in sentinel.nodes)
    return f"master {sentinel.master!r} through the sentinels at {nodes}, {for_display(sentinel.url)}"


async def close_client(client: RedisClient) -> None:
    """Close ``client`` and its pool; never raises (used on the way out)."""
    await redis_calls.quietly(client.aclose())


connect_redis = connect  # the name cdc.demo imports
