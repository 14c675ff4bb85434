"""Whether the source and Redis answer: ``cdc_up{component}`` and the
reason ``/readyz`` gives, as the sidecar last found out.

Every round trip is evidence, and the latest one wins: a call that returned,
or that the server refused (a table gone, a permission missing: the server
answered), says the component is up; a call that could not reach it
(``SourceUnavailable``, ``RedisUnavailable``, ``ConnectError``) says it is
down. Nothing is probed on a timer of its own: the sidecar talks to both all
the time (each table's reads, the shape check every 2 s, the lease round
every ``lease_ttl / 3``, the applier, checkpoints), so an idle sidecar still
finds an outage within seconds.

What is *not* evidence, because it may not reach the server: a read that the
source answers without a round trip (``quiet_for``, DESIGN.md §2) and a wait
for notifications (with ``notify: false`` it only sleeps). A failing wait
still reaches the tables: their quiet reads end with the listener, and the
next read goes to the server.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from cdc.errors import ConnectError, RedisUnavailable, SourceUnavailable, TransientError
from cdc.metrics import Metrics
from cdc.sources.base import ChangePage, ChangeSource, Cursor, SnapshotPage, TableInfo
from publishers.errors import CdcError
from publishers.redaction import redact

T = TypeVar("T")

CALLS = "calls"  # every call but the batch applier's
APPLY = "apply"  # the batch applier's, failing from its first failed try until one succeeds

# The source's calls that always make a round trip (``read_changes`` does
# unless the source knows it would find nothing, ``snapshot`` is a generator).
ROUND_TRIPS = frozenset(
    {
        "connect",
        "describe",
        "fingerprints",
        "current_version",
        "tracking_enable",
        "tracking_disable",
        "tracking_status",
        "cleanup",
        "doctor",
    }
)


class Component:
    """One component's reachability: the ``cdc_up`` series, and why it is down.

    Calls are judged per *path*: ``CALLS`` (every call but the applier's)
    and ``APPLY`` (the batch applier, while its retries fail). It is up when
    no path fails. Redis out of memory refuses the applier's writes while the
    lease rounds still pass (renewals do not allocate): judged on one path,
    the gauge would flip at every round; the applier's failure holds until
    the applier succeeds."""

    def __init__(self, name: str, metrics: Metrics, *, unreachable: tuple[type[BaseException], ...]) -> None:
        self.name = name
        self._gauge = metrics.up.labels(name)  # 0 until something answers
        self._unreachable = unreachable
        self._failing: dict[str, str] = {}  # path -> why its last call could not reach the component
        self._answered = False  # something ever answered
        self.last_evidence = 0.0  # time.monotonic() of the last call judged
        self.answered_at = 0.0  # time.monotonic() of the last call that reached it

    @property
    def up(self) -> bool:
        return self._answered and not self._failing

    @property
    def error(self) -> str | None:
        """Why it is down (None: the last calls reached it)."""
        return "; ".join(dict.fromkeys(self._failing.values())) or None

    def answered(self, path: str = CALLS) -> None:
        """A call reached the component (whatever it answered)."""
        self.last_evidence = self.answered_at = time.monotonic()
        if self._answered and path not in self._failing:
            return  # every poll says so: the gauge moves only on a change
        self._answered = True
        self._failing.pop(path, None)
        self._gauge.set(1 if self.up else 0)

    def failed(self, error: BaseException, path: str = CALLS) -> None:
        """A call could not reach the component."""
        self.last_evidence = time.monotonic()
        self._failing[path] = redact(str(error)) or type(error).__name__
        self._gauge.set(0)

    def judge(self, error: BaseException) -> None:
        """A call raised ``error``: down if it could not reach the component,
        up if the component refused (any other ``CdcError`` is an answer).
        Anything else (a cancellation, a bug) says nothing."""
        if isinstance(error, self._unreachable):
            self.failed(error)
        elif isinstance(error, CdcError) and not isinstance(error, TransientError):
            self.answered()

    async def observe(self, call: Awaitable[T]) -> T:
        """Await ``call``, judging its outcome."""
        try:
            result = await call
        except BaseException as exc:
            self.judge(exc)
            raise
        self.answered()
        return result


def source_component(metrics: Metrics) -> Component:
    return Component("source", metrics, unreachable=(SourceUnavailable, ConnectError))


def redis_component(metrics: Metrics) -> Component:
    return Component("redis", metrics, unreachable=(RedisUnavailable, ConnectError))


class ObservedSource:
    """A ``ChangeSource`` that tells its ``Component`` the outcome of every
    round trip (see the module docstring); everything else passes through."""

    def __init__(self, source: ChangeSource, component: Component) -> None:
        self.inner = source
        self.component = component
        self.kind = source.kind

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.inner, name)
        if name in ROUND_TRIPS and inspect.iscoroutinefunction(attribute):
            observed = self._observed(attribute)
            setattr(self, name, observed)  # made once: found directly from then on
            return observed
        return attribute

    def _observed(self, method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def call(*args: Any, **kwargs: Any) -> Any:
            return await self.component.observe(method(*args, **kwargs))

        return call

    async def read_changes(
        self,
        info: TableInfo,
        since: int,
        *,
        limit: int,
        upto: int | None = None,
        after: Cursor | None = None,
    ) -> ChangePage:
        quiet = upto is None and after is None and self.inner.quiet_for(info, since) > 0
        read = self.inner.read_changes(info, since, limit=limit, upto=upto, after=after)
        if quiet:
            return await read  # answered without a round trip: no evidence either way
        return await self.component.observe(read)

    def quiet_for(self, info: TableInfo, since: int) -> float:
        return self.inner.quiet_for(info, since)

    async def wait_for_changes(self, timeout: float) -> set[str]:
        return await self.inner.wait_for_changes(timeout)

    async def snapshot(
        self,
        info: TableInfo,
        *,
        page_size: int,
        after: tuple[Any, ...] | None = None,
        encoded: bool = False,
        start: tuple[Any, ...] | None = None,
        until: tuple[Any, ...] | None = None,
    ) -> AsyncIterator[SnapshotPage]:
        pages = self.inner.snapshot(
            info, page_size=page_size, after=after, encoded=encoded, start=start, until=until
        )
        try:
            while True:
                try:
                    page = await anext(pages)
                except StopAsyncIteration:
                    return
                except BaseException as exc:
                    self.component.judge(exc)
                    raise
                self.component.answered()
                yield page
        finally:
            close = getattr(pages, "aclose", None)
            if close is not None:
                await close()
