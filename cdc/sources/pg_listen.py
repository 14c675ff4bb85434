"""One LISTEN connection that wakes every waiting tracker.

The tracking triggers ``pg_notify('<tracking schema>', 'schema.name')`` when a
table changes. Each table's tracker calls ``wait_for_changes`` on the one
shared source, so the waits overlap: a single connection reading notifications
for each caller in turn would make the last caller wait for everyone else's
timeouts, and hand one caller's notifications to another. Instead one pump
task reads the connection and hands every notification to all current
waiters; each wait returns the tables notified while it waited. What arrives
while nobody waits is kept for the next wait, which returns it at once, so a
caller that waits in a loop misses no wake-up between its waits.

A notification is mostly a hint (trackers still poll on their backoff), so a
connection that fails is reported once and re-established on the next wait.
It is also evidence: ``mark()`` and ``quiet_since()`` tell the source that no
notification for a table arrived since a point in time, on a connection that
has been listening throughout; the source uses that to skip reads that cannot
find anything (``QuietReads``, used by ``PostgresSource.read_changes``).

A read that cannot find anything is not sent. After an empty read whose
snapshot had ``xmin = xmax`` (``xmax`` is one past the newest completed
transaction, so every transaction that had committed is at or below the
bound ``xmin - 1``), any later change to the table is made by a transaction
that commits after that snapshot, and its notify trigger's notification
arrives after the read began. So while the LISTEN connection has been up
throughout and no notification for the table has arrived, the next read from
that bound would find nothing: ``read_changes`` answers it without a round
trip, and ``quiet_for`` tells the tracker that it may wait for the
notification instead of polling on its backoff. Only for ordinary tables (a
write straight into a partition does not fire its partitioned parent's
statement triggers), and never for longer than ``QUIET_READ_LIMIT`` after
the last read sent: a backstop should a table's notify trigger be disabled.
This is what lets fifty idle tables cost next to nothing in their first
minutes of quiet, while their backoff still polls every 50 ms to 1 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow

from cdc.errors import SourceUnavailable

Connection = psycopg.AsyncConnection[TupleRow]

# Seconds after the last read sent during which a read that cannot find
# anything may be answered without a round trip (see the module docstring).
QUIET_READ_LIMIT = 30.0


class NotificationListener:
    def __init__(self, connect: Callable[[], Awaitable[Connection]], channel: str) -> None:
        self._connect = connect
        self._channel = channel
        self._conn: Connection | None = None
        self._pump: asyncio.Task[None] | None = None
        self._waiters: list[tuple[set[str], asyncio.Event]] = []
        self._unclaimed: set[str] = set()  # notified while nobody waited
        self._failure: BaseException | None = None
        self._epoch = 0  # connections established so far
        self._count = 0  # notifications received so far, on any connection
        self._last: dict[str, int] = {}  # payload ("schema.name") -> _count at its latest notification

    def mark(self) -> tuple[int, int] | None:
        """Where the listener is now, (connection, notifications received), or
        None when it is not listening (never started, or its connection failed)."""
        if self._pump is None or self._pump.done() or self._failure is not None:
            return None
        return self._epoch, self._count

    def quiet_since(self, mark: tuple[int, int], table: str) -> bool:
        """Whether the listener has listened without a break since ``mark``
        and received no notification for ``table`` ("schema.name") since."""
        now = self.mark()
        return now is not None and now[0] == mark[0] and self._last.get(table, 0) <= mark[1]

    async def wait(self, timeout: float) -> set[str]:
        """The tables notified within ``timeout`` seconds (returns at the first)."""
        await self._start()
        if self._unclaimed:
            unclaimed, self._unclaimed = self._unclaimed, set()
            return unclaimed
        waiter: tuple[set[str], asyncio.Event] = (set(), asyncio.Event())
        self._waiters.append(waiter)
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await waiter[1].wait()
        finally:
            self._waiters.remove(waiter)
        if self._failure is not None:
            raise SourceUnavailable(f"PostgreSQL notifications: {self._failure}")
        return waiter[0]

    async def _start(self) -> None:
        if self._pump is not None and not self._pump.done():
            return
        await self.close()
        try:
            conn = await self._connect()
            await conn.execute(sql.SQL("listen {}").format(sql.Identifier(self._channel)))
        except psycopg.Error as exc:
            raise SourceUnavailable(f"PostgreSQL notifications: cannot listen: {exc}") from exc
        self._conn, self._failure = conn, None
        self._epoch += 1
        self._pump = asyncio.create_task(self._run(conn), name="cdc-postgres-notifications")

    async def _run(self, conn: Connection) -> None:
        try:
            async for notify in conn.notifies():
                self._count += 1
                self._last[notify.payload] = self._count
                if not self._waiters:
                    self._unclaimed.add(notify.payload)
                for tables, event in self._waiters:
                    tables.add(notify.payload)
                    event.set()
        except psycopg.Error as exc:  # the connection is gone: wake everyone, reconnect on the next wait
            self._failure = exc
        finally:
            for _, event in self._waiters:
                event.set()

    async def close(self) -> None:
        pump, conn = self._pump, self._conn
        self._pump = self._conn = None
        if pump is not None:
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pump
        if conn is not None:
            await conn.close()


@dataclass(frozen=True)
class _Quiet:
    """An empty read that saw every committed transaction, and the listener's
    mark when it started: reads from ``bound`` find nothing while the listener
    stays quiet about the table."""

    bound: int
    mark: tuple[int, int]
    at: float  # time.monotonic() of the read


# A sent read's start: the listener's mark and time.monotonic().
ReadStart = tuple[tuple[int, int], float]


class QuietReads:
    """Which tables' next read is known to find nothing (see the module docstring)."""

    def __init__(self, listener: NotificationListener) -> None:
        self._listener = listener
        self._notifying: dict[str, str] = {}  # ordinary tables: name -> their notifications' payload
        self._quiet: dict[str, _Quiet] = {}  # table -> its last read, when it allows skipping the next

    def watch(self, table: str, payload: str | None) -> None:
        """A table described: the payload of its notifications, None for a
        partitioned table (a write into a partition does not notify it)."""
        self._quiet.pop(table, None)
        if payload is None:
            self._notifying.pop(table, None)
        else:
            self._notifying[table] = payload

    def clear(self) -> None:
        self._quiet.clear()

    def skip(self, table: str, since: int) -> int | None:
        """The bound of a read from ``since`` known to find nothing, or None."""
        quiet = self._quiet.get(table)
        return quiet.bound if quiet is not None and self._still_quiet(table, since, quiet) else None

    def begin(self, table: str) -> ReadStart | None:
        """A read is sent: only its outcome may allow skipping again. Its start,
        when the table notifies and the listener listens."""
        self._quiet.pop(table, None)
        mark = None if table not in self._notifying else self._listener.mark()
        started = time.monotonic()
        return None if mark is None else (mark, started)

    def settle(self, table: str, start: ReadStart | None, bound: int) -> None:
        """An empty read from ``start`` that saw every committed transaction."""
        if start is not None:
            self._quiet[table] = _Quiet(bound, start[0], start[1])

    def quiet_for(self, table: str, since: int) -> float:
        """How long a read from ``since`` is known to find nothing unless the
        table's notification arrives (the rest of ``QUIET_READ_LIMIT``), or 0."""
        quiet = self._quiet.get(table)
        if quiet is None or not self._still_quiet(table, since, quiet):
            return 0.0
        return max(0.0, quiet.at + QUIET_READ_LIMIT - time.monotonic())

    def _still_quiet(self, table: str, since: int, quiet: _Quiet) -> bool:
        """Whether a read from ``since`` would find nothing, known without sending it."""
        payload = self._notifying.get(table)
        return (
            since == quiet.bound
            and payload is not None
            and time.monotonic() - quiet.at < QUIET_READ_LIMIT
            and self._listener.quiet_since(quiet.mark, payload)
        )
