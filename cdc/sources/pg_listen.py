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

The pump also keeps the connection. A connection the server closes
(``pg_terminate_backend`` from a PgBouncer restart, a failover, an
idle-session killer) ends psycopg's ``notifies()`` generator with an
``OperationalError`` as soon as the socket reports it (6 ms after
``pg_terminate_backend`` on loopback, measured). Then, and again once a new
connection listens, every table the source described is reported notified,
so that the pipeline wakes every tracker: one asleep in a quiet wait (below,
up to ``QUIET_READ_LIMIT``) would otherwise sleep through the changes made
while nobody listened, which no notification will ever announce. While the
connection is down ``mark()`` is None, so no read is skipped and the trackers
poll on their backoff: reads go on. The pump reconnects at once, then with a
jittered backoff up to ``RECONNECT_CAP``; it logs once that notifications are
lost and once that they are back, however many attempts lie between. Before
this, the loss went unnoticed by the sleeping trackers until the 30 s
backstop: a change made after the sidecar's backends were killed took 26 s to
reach Redis; it takes about 0.6 s now (tests/cdc/test_listen_loss.py).

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
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow

from publishers.redaction import mask_passwords

Connection = psycopg.AsyncConnection[TupleRow]

log = logging.getLogger("cdc.sources.postgres")

# Seconds after the last read sent during which a read that cannot find
# anything may be answered without a round trip (see the module docstring).
QUIET_READ_LIMIT = 30.0
# Reconnecting after a loss: the first attempt at once (a terminated backend's
# server is usually up), then after 0.25-0.5 s, 0.5-1 s, ... up to 2.5-5 s
# (as a tracker retries a read, cdc.tracker.RETRY_WAIT), jittered so that
# sidecars that lost their database together do not reconnect in lockstep.
RECONNECT_FIRST = 0.5
RECONNECT_CAP = 5.0
# Connection failures that end a connection or an attempt to make one.
LOST = (psycopg.Error, OSError)


def reconnect_delay(failures: int) -> float:
    """Seconds before the next attempt after ``failures`` attempts in a row failed (0: the loss itself)."""
    if failures == 0:
        return 0.0
    ceiling = min(RECONNECT_CAP, RECONNECT_FIRST * 2 ** (failures - 1))
    return random.uniform(ceiling / 2, ceiling)


class NotificationListener:
    def __init__(self, connect: Callable[[], Awaitable[Connection]], channel: str) -> None:
        self._connect = connect
        self._channel = channel
        self._pump: asyncio.Task[None] | None = None
        self._first_attempt = asyncio.Event()  # set once the pump's first connection attempt ended
        self._waiters: list[tuple[set[str], asyncio.Event]] = []
        self._unclaimed: set[str] = set()  # notified while nobody waited
        self._listening = False  # a connection is up and has run LISTEN
        self._lost_at: float | None = None  # time.monotonic() when listening was lost (or first failed)
        self._epoch = 0  # connections established so far
        self._count = 0  # notifications received so far, on any connection
        self._last: dict[str, int] = {}  # payload ("schema.name") -> _count at its latest notification
        self.tables: set[str] = set()  # every table to wake when listening is lost or back

    def mark(self) -> tuple[int, int] | None:
        """Where the listener is now, (connection, notifications received), or
        None when it is not listening (never started, or its connection lost)."""
        return (self._epoch, self._count) if self._listening else None

    def quiet_since(self, mark: tuple[int, int], table: str) -> bool:
        """Whether the listener has listened without a break since ``mark``
        and received no notification for ``table`` ("schema.name") since."""
        now = self.mark()
        return now is not None and now[0] == mark[0] and self._last.get(table, 0) <= mark[1]

    async def wait(self, timeout: float) -> set[str]:
        """The tables notified within ``timeout`` seconds (returns at the
        first); every table in ``tables`` when listening was lost or is back.
        Never raises for a lost connection: the pump reconnects by itself."""
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
        return waiter[0]

    async def _start(self) -> None:
        """The pump running; on the first call, its first connection attempt
        made (so that a caller listens from the moment its first wait returns)."""
        pump = self._pump
        error = pump.exception() if pump is not None and pump.done() and not pump.cancelled() else None
        if error is not None:
            raise error  # a defect, not a connection lost (the pump survives those): show it
        if pump is None or pump.done():
            self._first_attempt.clear()
            self._pump = asyncio.create_task(self._run(), name="cdc-postgres-notifications")
        await self._first_attempt.wait()

    async def _run(self) -> None:
        """Listen, hand notifications out, and listen again after every loss."""
        failures = 0
        while True:
            await asyncio.sleep(reconnect_delay(failures))
            try:
                conn = await self._listen()
            except LOST as exc:
                failures += 1
                self._lost(f"cannot listen: {exc}")
                continue
            finally:
                self._first_attempt.set()
            failures = 0
            try:
                await self._pump_notifications(conn)
            except LOST as exc:
                self._lost(str(exc))
            finally:
                self._listening = False
                await conn.close()

    async def _listen(self) -> Connection:
        conn = await self._connect()
        try:
            await conn.execute(sql.SQL("listen {}").format(sql.Identifier(self._channel)))
        except BaseException:
            await conn.close()
            raise
        self._epoch += 1
        self._listening = True
        if self._lost_at is not None:
            log.info(
                "PostgreSQL notifications are back: tables wait for them again",
                extra={"down_seconds": round(time.monotonic() - self._lost_at, 3)},
            )
            self._lost_at = None
            self._wake_everyone()  # what changed while nobody listened was never notified
        return conn

    async def _pump_notifications(self, conn: Connection) -> None:
        async for notify in conn.notifies():
            self._count += 1
            self._last[notify.payload] = self._count
            self._hand_out({notify.payload})

    def _lost(self, why: str) -> None:
        """Listening lost (or an attempt failed): wake every table, said once per loss."""
        self._listening = False
        if self._lost_at is None:
            self._lost_at = time.monotonic()
            log.warning(
                "PostgreSQL notifications lost: tables are polled on their backoff until listening again",
                extra={"error": mask_passwords(why.strip())},
            )
            self._wake_everyone()

    def _wake_everyone(self) -> None:
        self._hand_out(set(self.tables))

    def _hand_out(self, tables: set[str]) -> None:
        if not self._waiters:
            self._unclaimed |= tables
        for notified, event in self._waiters:
            notified |= tables
            event.set()

    async def close(self) -> None:
        pump, self._pump = self._pump, None
        self._listening = False
        if pump is not None:
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pump


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
        self._listener.tables.add(table)  # woken when listening is lost or back, partitioned or not
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
