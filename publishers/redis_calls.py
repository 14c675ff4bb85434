"""Every Redis command goes through here: redis-py errors become ours.

The adapter boundary of DESIGN.md §7: nothing outside ``publishers`` sees a
redis-py exception. Errors that may pass (link down, timeout, server loading,
read-only replica after a failover, cluster resharding, out of memory) become
``RedisUnavailable``, the ``TransientError`` branch the daemon retries; a
damaged layout (``CDCLAYOUT`` from a script) or any other refusal is a plain
``CdcError``; a stale lease owner's write (``FENCED``) is ``LeaseLost``.
The apply path sorts the replies of its calls itself (``blocked_reason``,
``is_content_error``, ``is_fenced``): a blocked partition does not stop a batch.
Messages never carry the URL's password (``publishers.redaction``).

``call`` awaits one command (or a pipeline, or a function of several) so that
a cancellation never abandons it half-way (``finish``), mapping its errors.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from redis import exceptions as rex

from publishers.errors import CdcError, ConnectError, LeaseLost, RedisUnavailable
from publishers.redaction import for_display, scrub_url, url_problem

T = TypeVar("T")

SOCKET_TIMEOUT = 60.0  # above any script call and any XREAD BLOCK we issue

# What a Redis command can raise: redis-py's errors and the socket's own.
REDIS_ERRORS: tuple[type[BaseException], ...] = (rex.RedisError, rex.RedisClusterException, OSError)
# What the server answered a command with (a pipeline slot holds these).
_ERROR_REPLIES: tuple[type[BaseException], ...] = (rex.ResponseError, rex.ClusterError)
_URL_ERRORS: tuple[type[BaseException], ...] = (ValueError, *REDIS_ERRORS)  # from_url's refusals
# What the first command raises for a URL option that the connection does not
# take (?foo=1: TypeError, an unexpected keyword) or whose value is wrong.
_OPTION_ERRORS: tuple[type[BaseException], ...] = (TypeError, ValueError)

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


async def call(awaitable: Awaitable[T], url: str = "", *, grace: float = SOCKET_TIMEOUT) -> T:
    """Await one Redis command (never abandoned half-way), mapping its errors."""
    try:
        return await finish(awaitable, grace)
    except REDIS_ERRORS as exc:
        raise translate(exc, url) from None


def text(value: Any) -> str:
    """A reply value as text (redis-py gives bytes unless decode_responses)."""
    return value.decode() if isinstance(value, bytes) else str(value)


async def execute(pipe: Any, url: str = "", *, raise_on_error: bool = True) -> list[Any]:
    """Run a pipeline (never abandoned half-way), mapping its errors."""
    replies: list[Any] = await call(pipe.execute(raise_on_error=raise_on_error), url)
    return replies


async def reply_or_error(awaitable: Awaitable[Any], url: str = "") -> Any:
    """The reply, or the error the server answered with (a failure of this
    command alone, as a pipeline slot holds it); other failures are mapped."""
    try:
        return await finish(awaitable)
    except _ERROR_REPLIES as exc:
        return exc
    except REDIS_ERRORS as exc:
        raise translate(exc, url) from None


async def connected(awaitable: Awaitable[T], url: str) -> T:
    """Await the first command of a new client: any failure is ``ConnectError``."""
    try:
        return await finish(awaitable)
    except REDIS_ERRORS as exc:
        reason = scrub_url(describe(exc), url)
        raise ConnectError(f"cannot connect to Redis at {for_display(url)}: {reason}") from None
    except _OPTION_ERRORS as exc:  # redis-py passes the URL's ?options to the connection as they are
        reason = scrub_url(describe(exc), url)
        raise ConnectError(
            f"bad Redis URL {for_display(url)}: an option in its query is wrong: {reason}"
        ) from None


def build(make: Callable[[], T], url: str) -> T:
    """A client from ``make()``: a URL that is wrong (``url_problem``) or that
    redis-py refuses is ``ConnectError``. A URL whose password a parser cuts
    short is refused before redis-py reads it: it would quote the pieces."""
    problem = url_problem(url)
    if problem is not None:
        raise ConnectError(f"bad Redis URL {for_display(url)}: {problem}")
    try:
        return make()
    except _URL_ERRORS as exc:
        raise ConnectError(f"bad Redis URL {for_display(url)}: {scrub_url(str(exc), url)}") from None


async def quietly(awaitable: Coroutine[Any, Any, Any]) -> None:
    """Await a command whose failure does not matter (closing on the way out)."""
    try:
        await awaitable
    except REDIS_ERRORS:
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


# -- sorting errors --------------------------------------------------------------


def translate(exc: BaseException, url: str = "") -> CdcError:
    """The ``publishers.errors`` counterpart of a redis-py error, password-free."""
    text = str(exc)
    if text.startswith("CDCLAYOUT"):
        return CdcError(_layout_damaged(text))
    if is_fenced(exc):
        return LeaseLost(text)
    message = scrub_url(describe(exc), url) if url else describe(exc)
    if is_transient(exc):
        return RedisUnavailable(f"Redis is unavailable: {message}")
    return CdcError(f"Redis refused a command: {message}")


def is_transient(exc: BaseException) -> bool:
    """True for errors that may pass if the same command is sent again."""
    if isinstance(exc, rex.NoScriptError):
        return False
    return isinstance(exc, _TRANSIENT_TYPES) or error_code(exc) in _TRANSIENT_CODES


def is_content_error(error: BaseException) -> bool:
    """A script refused what it was given (e.g. ``WRONGTYPE``: someone wrote a
    string at a document key), not the link, the layout or our permissions:
    the change that caused it goes to the dead letter."""
    if not isinstance(error, rex.ResponseError) or is_transient(error):
        return False
    if isinstance(error, rex.NoScriptError):
        return False
    return blocked_reason(error) is None


def blocked_reason(error: BaseException, *, shared_key: str | None = None) -> str | None:
    """Why ``error`` means that a key which a whole partition shares cannot be
    written, or None. Such a key blocks every change of the partition, and
    none of them is at fault: retrying cannot help until the key is repaired,
    and the dead letter is no place for the changes.

    - ``CDCLAYOUT`` (``apply.lua``): ``@seq`` not an integer, a shared key of
      the wrong type, a stream ahead of ``@seq``;
    - ``NOPERM``: the ACL refuses this user a key or channel of the partition
      (or the command itself: then every partition is blocked alike);
    - with ``shared_key`` (a command on one key that is no document: the
      partitions set of a section, the dead letter), any refusal that is not
      transient, e.g. ``WRONGTYPE``.
    """
    if not isinstance(error, rex.ResponseError) or is_transient(error) or is_noscript(error):
        return None
    text = str(error)
    if text.startswith("CDCLAYOUT"):
        return _layout_damaged(text)
    if isinstance(error, rex.NoPermissionError) or error_code(error) == "NOPERM":
        where = f" to {shared_key}" if shared_key else ""
        return f"Redis denied access{where} (NOPERM): {text.removeprefix('NOPERM ')}"
    if shared_key is not None:
        return f"Redis layout is damaged: {shared_key} cannot be written ({redis_message(error)})"
    return None


def _layout_damaged(text: str) -> str:
    return f"Redis layout is damaged: {text.removeprefix('CDCLAYOUT ')}"


def is_fenced(reply: Any) -> bool:
    """A script refused a stale lease owner's write (before writing anything)."""
    return isinstance(reply, rex.ResponseError) and str(reply).startswith("FENCED")


def is_error_reply(reply: Any) -> bool:
    """The server refused this command alone (what ``reply_or_error`` returns
    rather than raises)."""
    return isinstance(reply, _ERROR_REPLIES)


def is_noscript(reply: Any) -> bool:
    """The server does not know the script (restarted, failed over, flushed)."""
    return isinstance(reply, rex.NoScriptError)


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


def redis_message(error: BaseException) -> str:
    """The Redis error text with its code (redis-py strips known codes)."""
    text = str(error)
    code = getattr(error, "status_code", None)
    return f"{code} {text}" if code and not text.startswith(code) else text
