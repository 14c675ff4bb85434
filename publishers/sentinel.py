"""A client for the primary that Redis Sentinel names (``redis.sentinel``).

redis-py's ``redis.asyncio.sentinel`` asks the sentinels for the primary's
address whenever a connection is made, and drops a connection that answers
``READONLY`` (a primary demoted to a replica), so after a failover the next
connection goes to the new primary. Two URLs carry TLS and the ACL: the
sentinels' (``SentinelConfig.url``) and the primary's (``RedisConfig.url``);
neither names a host. The password they hold is never shown
(``publishers.redaction``).
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.connection import SSLConnection, parse_url
from redis.asyncio.sentinel import Sentinel, SentinelManagedConnection, SentinelManagedSSLConnection
from redis.typing import EncodableT

from publishers.packing import pack as _pack
from publishers.settings import SentinelConfig


class HiredisSentinelConnection(SentinelManagedConnection):
    def pack_command(self, *args: EncodableT) -> list[bytes]:
        return _pack(args) or super().pack_command(*args)


class HiredisSentinelSSLConnection(SentinelManagedSSLConnection):
    def pack_command(self, *args: EncodableT) -> list[bytes]:
        return _pack(args) or super().pack_command(*args)


class SentinelRedis(aioredis.Redis):
    """The primary's client; closing it closes the sentinels' clients too."""

    sentinels: Sentinel | None = None

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        if self.sentinels is not None:
            for node in self.sentinels.sentinels:
                await node.aclose()


def url_options(url: str) -> dict[str, Any]:
    """What a host-less URL says: user, password, database, TLS and its
    ``ssl_*`` query options, as redis-py keyword arguments (``ssl=True`` for
    ``rediss://``)."""
    options: dict[str, Any] = dict(parse_url(url))
    options.pop("host", None)
    options.pop("port", None)
    if options.pop("connection_class", None) is SSLConnection:
        options["ssl"] = True
    return options


def sentinel_client(url: str, sentinel: SentinelConfig, options: dict[str, Any]) -> SentinelRedis:
    """A client of the primary ``sentinel.master``, found through ``sentinel.nodes``.

    ``options`` (timeouts, decoding) apply to both the sentinels and the
    primary; the sentinels never get the primary's password, nor it theirs."""
    primary = url_options(url)
    primary["connection_class"] = (
        HiredisSentinelSSLConnection if primary.pop("ssl", False) else HiredisSentinelConnection
    )
    sentinels = Sentinel(  # type: ignore[no-untyped-call]
        list(sentinel.nodes), sentinel_kwargs={**options, **url_options(sentinel.url)}, **options
    )
    client = sentinels.master_for(sentinel.master, redis_class=SentinelRedis, **primary)
    assert isinstance(client, SentinelRedis)
    client.sentinels = sentinels
    return client
