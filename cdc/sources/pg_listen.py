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
find anything (``PostgresSource.read_changes``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow

from cdc.errors import SourceUnavailable

Connection = psycopg.AsyncConnection[TupleRow]


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
