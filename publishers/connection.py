"""Building the Redis client, and mapping redis-py errors onto cdc.errors.

The adapter boundary of DESIGN.md §7: nothing outside ``publishers`` sees a
redis-py exception. Errors that may pass (link down, timeout, server loading,
read-only replica after a failover, cluster resharding, out of memory) become
``RedisUnavailable``, the ``TransientError`` branch the daemon retries; failing
to reach Redis at start-up is a ``ConnectError`` (exit code 3).

URLs may carry an ACL password (``redis://user:secret@host``); ``redact`` and
``scrub`` make sure it never reaches a log line or an error message.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable
from typing import Any, TypeAlias, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import hiredis  # a dependency (redis[hiredis]): its C parser and command packer
import redis.asyncio as aioredis
from redis import exceptions as rex
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import AbstractConnection, SSLConnection, UnixDomainSocketConnection
from redis.typing import EncodableT

from publishers.errors import CdcError, ConnectError, RedisUnavailable
from publishers.settings import RedisConfig

RedisClient: TypeAlias = "aioredis.Redis | RedisCluster"
T = TypeVar("T")

CONNECT_TIMEOUT = 10.0
SOCKET_TIMEOUT = 60.0  # above any script call and any XREAD BLOCK we issue

_TRANSIENT_TYPES: tuple[type[BaseException], ...] = (
    rex.ConnectionError,  # includes BusyLoadingError, AuthenticationError, MaxConnectionsError
    rex.TimeoutError,
    rex.ReadOnlyError,
    rex.TryAgainError,
    rex.ClusterDownError,  # includes MasterDownError
    rex.OutOfMemoryError,
    rex.SlotNotCoveredError,
    rex.AskError,  # includes MovedError, when redirections ran out mid-resharding
    ConnectionError,
    TimeoutError,
)
# Error codes that redis-py leaves as a plain ResponseError, e.g. when they
# come back from inside a script ("OOM command not allowed ... script: ...").
_TRANSIENT_CODES = frozenset(
    {"OOM", "LOADING", "BUSY", "READONLY", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "NOREPLICAS"}
)


def redact(url: str) -> str:
    """``url`` with its password (userinfo or ``?password=``) replaced by ``***``."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, _, hostport = netloc.rpartition("@")
            user, colon, _ = userinfo.partition(":")
            netloc = f"{user}:***@{hostport}" if colon else f"{userinfo}@{hostport}"
        query = parts.query
        if query:
            pairs = parse_qsl(query, keep_blank_values=True)
            query = urlencode([(k, "***" if k.lower() == "password" else v) for k, v in pairs], safe="*")
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    except ValueError:
        return "<unparsable Redis URL>"


def _secrets(url: str) -> list[str]:
    """Every form the URL's password may take in a message (raw and quoted)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return []
    found = [parts.password or ""]
    found += [v for k, v in parse_qsl(parts.query) if k.lower() == "password"]
    if "@" in parts.netloc:
        found.append(parts.netloc.rpartition("@")[0].partition(":")[2])
    return [s for s in found if s]


def scrub(text: str, url: str) -> str:
    """``text`` with every occurrence of the URL's password and the URL
    itself replaced, for messages built from driver errors."""
    text = text.replace(url, redact(url))
    for secret in sorted(_secrets(url), key=len, reverse=True):
        text = re.sub(re.escape(secret), "***", text)
    return text


# -- packing commands with hiredis ------------------------------------------------
#
# redis-py's asyncio connections pack commands in pure Python (its blocking
# ones use hiredis). An apply call is one EVALSHA with ~17 arguments per
# change, and packing it was half of the apply path's CPU; hiredis packs it in C.


def _pack(args: tuple[EncodableT, ...]) -> list[bytes] | None:
    """The RESP bytes of a command, or None to let redis-py pack it (types
    hiredis does not take get redis-py's own error message)."""
    first = args[0]
    if isinstance(first, str) and " " in first:  # "SCRIPT LOAD": one word per argument
        args = (*first.split(), *args[1:])
    try:
        return [hiredis.pack_command(args)]  # type: ignore[arg-type]
    except TypeError:
        return None


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
    discovers the other nodes from the one named. Replies stay bytes: values
    are JSON text that we hand to orjson as they are.
    """
    options: dict[str, Any] = {
        "decode_responses": False,
        "socket_connect_timeout": CONNECT_TIMEOUT,
        "socket_timeout": SOCKET_TIMEOUT,
        "health_check_interval": 30,
    }
    try:
        if config.cluster:
            if config.url.startswith("unix://"):
                raise ConnectError(
                    f"Redis Cluster cannot be reached over a unix socket: {redact(config.url)}"
                )
            client: RedisClient = RedisCluster.from_url(config.url, **options)
        else:
            client = aioredis.Redis.from_url(config.url, **options)
    except (ValueError, rex.RedisError, rex.RedisClusterException) as exc:
        raise ConnectError(f"bad Redis URL {redact(config.url)}: {scrub(str(exc), config.url)}") from None
    use_hiredis_packing(client)
    return client


async def connect(config: RedisConfig) -> RedisClient:
    """A client that has answered PING; ``ConnectError`` (exit code 3) if not."""
    client = create_client(config)
    try:
        await client.ping()
    except (rex.RedisError, rex.RedisClusterException, OSError) as exc:
        await close_client(client)
        reason = scrub(describe(exc), config.url)
        raise ConnectError(f"cannot connect to Redis at {redact(config.url)}: {reason}") from None
    return client


async def close_client(client: RedisClient) -> None:
    """Close ``client`` and its pool; never raises (used on the way out)."""
    try:
        await client.aclose()
    except (rex.RedisError, OSError):
        pass


async def finish(awaitable: Awaitable[T], grace: float = SOCKET_TIMEOUT) -> T:
    """Await a Redis command that a cancellation must not abandon half-way.

    redis-py can hand a connection back to its pool with a reply still unread
    when a command is cancelled after it was sent (redis-py #2579; the cluster
    client then gives the next command the previous one's reply, #2632). So the
    command runs as its own task: a cancellation waits for it to finish (for
    at most ``grace`` seconds, e.g. an XREAD's BLOCK) and is then re-raised.
    """
    task = asyncio.ensure_future(awaitable)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        if not task.done():
            await asyncio.wait({task}, timeout=grace)
        task.add_done_callback(_retrieve)
        raise


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Mark an abandoned command's outcome as seen (no 'never retrieved' noise)."""
    if not task.cancelled():
        task.exception()


def describe(exc: BaseException) -> str:
    """A one-line account of a driver error: its class and message."""
    text = str(exc).strip() or repr(exc)
    return f"{type(exc).__name__}: {text}"


def error_code(exc: BaseException) -> str:
    """The Redis error code (``WRONGTYPE``, ``OOM``...), or ``""``."""
    code = getattr(exc, "status_code", None)
    if isinstance(code, str) and code:
        return code
    first = str(exc).split(" ", 1)[0]
    return first if first.isupper() else ""


def is_transient(exc: BaseException) -> bool:
    """True for errors that may pass if the same command is sent again."""
    if isinstance(exc, rex.NoScriptError):
        return False
    return isinstance(exc, _TRANSIENT_TYPES) or error_code(exc) in _TRANSIENT_CODES


def translate(exc: BaseException, url: str = "") -> CdcError:
    """The cdc.errors counterpart of a redis-py error, password-free."""
    message = scrub(describe(exc), url) if url else describe(exc)
    if is_transient(exc):
        return RedisUnavailable(f"Redis is unavailable: {message}")
    return CdcError(f"Redis refused a command: {message}")


connect_redis = connect  # the name cdc.demo imports
