"""The per-database version watcher: idle SQL Server tables cost next to nothing.

SQL Server Change Tracking sends no notification, so without this every table
polls on its backoff: a SNAPSHOT transaction, three statements and a
CHANGETABLE per poll, and a change to an idle table waits out the backoff
(up to 5 s). Instead one connection asks, once per ``TICK`` (100 ms), one cheap
statement (``mssql_sql.WATCH_TICK``, no transaction): the database's current
version, its identity (database_guid, recovery_fork_guid) and a summary of
``sys.change_tracking_tables`` (how many tracked tables, the newest
begin_version, a checksum of (object_id, begin_version)).

- **Wake-ups.** When the version or anything else the tick reads moves,
  ``wait`` returns every described table, so each tracker reads at once: a
  change is seen within about a tick. The version is the database's, not a
  table's: while the database is busy every table of it reads about once a
  tick (as if polled every 100 ms); telling which table moved would take a
  CHANGETABLE per table.
- **Skipped reads** (``WatchedReads``). Versions are stamped at commit, so a
  read from ``since`` finds nothing while the current version is ``since``. A
  fresh read (no ``upto``/``after``) whose ``since`` is the version of the
  latest tick is answered without a round trip, empty, with ``since`` as its
  bound (which is always a consistent answer: it claims nothing new), when
  also: the tick is at most ``STALE`` old; the table's last read that went to
  the server completed, started at the same epoch (database identity and
  tracked-tables summary), and is less than ``QUIET_READ_LIMIT`` ago. So a
  TRUNCATE, tracking turned off or on, a dropped table (its row leaves the
  view), a restore or a failover (the database identity) all end the skipping
  at the next tick: the next read goes to the server and finds them. A
  backstop read every ``QUIET_READ_LIMIT`` covers what the summary cannot see
  (a checksum collision; a table the login cannot see). ``quiet_for`` tells
  the tracker how long it may wait for a wake-up instead of polling.
- **Failure.** A tick that fails (the connection lost, a timeout) ends the
  evidence at once: no read is skipped and ``quiet_for`` is 0, and every
  table is woken once, so trackers waiting on a wake-up go back to reading on
  their backoff. The watcher keeps trying, every ``RETRY_TICK``; never silence.
- **The database, checked with each read.** Microsoft recommends a synchronizing
  client check a database identity with each sync (Work with change tracking,
  "Change Tracking and Data Restore", learn.microsoft.com): before a read goes
  to the server, the database part of the table's described identity is
  compared with the latest tick's (or, with no fresh tick, read on the spot):
  another one is a ``SchemaError`` naming a restore or failover; the table is
  described again and, its identity changed, snapshotted (``cdc.shapes``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from cdc.errors import SchemaError
from cdc.shapes import identity_change, identity_parts
from cdc.sources import mssql_sql as sql
from cdc.sources.base import ChangePage, TableInfo
from cdc.sources.mssql_link import fetch_one, fetch_scalar

log = logging.getLogger("cdc.sources.mssql")

TICK = 0.1  # seconds between two ticks: a change to an idle table is read within about this
RETRY_TICK = 1.0  # after a failed tick
STALE = 1.0  # a tick older than this is no evidence that nothing changed
QUIET_READ_LIMIT = 30.0  # a table's reads go to the server at least this often
_DATABASE_LABELS = ("database", "fork")


@dataclass(frozen=True)
class Tick:
    """What one tick read: the current version (None: tracking is off for the
    database), the database's identity, and the tracked tables' summary."""

    version: int | None
    database: str
    tracked: str

    @property
    def epoch(self) -> str:
        return f"{self.database}; tables {self.tracked}"


@dataclass(frozen=True)
class Seen:
    tick: Tick
    at: float  # time.monotonic() when it was read


def read_tick(conn: Any) -> Tick:
    """One tick (``mssql_sql.WATCH_TICK``), as a unit of work on a link."""
    version, database, tracked = fetch_one(conn, sql.WATCH_TICK)
    return Tick(None if version is None else int(version), str(database), str(tracked))


def read_database_identity(conn: Any) -> str:
    """The database's identity now (``mssql_sql.DATABASE_IDENTITY``), as a unit of work."""
    return str(fetch_scalar(conn, sql.DATABASE_IDENTITY))


class VersionWatcher:
    """Ticks on a connection of its own and wakes the trackers (module docstring).

    ``observe`` reads one tick (``MssqlSource`` runs ``mssql_sql.WATCH_TICK`` on
    its watch link; tests may hand any coroutine); ``tables`` names the tables
    a move wakes. One caller waits at a time (``Pipeline.listen``): what
    arrives while it does not wait is kept for its next wait."""

    def __init__(
        self, observe: Callable[[], Awaitable[Tick]], tables: Callable[[], set[str]], *, tick: float = TICK
    ) -> None:
        self._observe = observe
        self._tables = tables
        self._tick = tick
        self._seen: Seen | None = None  # the latest tick, None while failing
        self._pending: set[str] = set()  # tables woken and not yet returned by ``wait``
        self._moved = asyncio.Event()
        self._pump: asyncio.Task[None] | None = None

    def latest(self) -> Seen | None:
        """The latest tick while it is evidence (watching, and at most STALE old)."""
        seen = self._seen
        if seen is None or self._pump is None or self._pump.done() or time.monotonic() - seen.at > STALE:
            return None
        return seen

    async def wait(self, timeout: float) -> set[str]:
        """The tables to wake, as soon as there are any, within ``timeout`` seconds."""
        self.start()
        if not self._pending:
            self._moved.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._moved.wait()
        woken, self._pending = self._pending, set()
        return woken

    def start(self) -> None:
        if self._pump is None or self._pump.done():
            self._pump = asyncio.create_task(self._run(), name="cdc-mssql-version-watcher")

    async def close(self) -> None:
        pump, self._pump = self._pump, None
        self._seen = None
        if pump is not None:
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pump

    async def _run(self) -> None:
        while True:
            try:
                tick = await self._observe()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # any failure ends the evidence; the trackers read again
                self._failed(exc)
                await asyncio.sleep(RETRY_TICK)
                continue
            self._observed(tick)
            await asyncio.sleep(self._tick)

    def _observed(self, tick: Tick) -> None:
        before, self._seen = self._seen, Seen(tick, time.monotonic())
        if before is None:
            log.info("SQL Server version watcher: watching", extra={"version": tick.version})
        elif before.tick != tick:
            self._wake()

    def _failed(self, exc: Exception) -> None:
        if self._seen is not None:
            log.warning(
                "SQL Server version watcher: a tick failed; every table reads on its backoff until it is back",
                extra={"error": str(exc)},
            )
            self._wake()  # trackers waiting for a wake-up must not wait out quiet_for
        self._seen = None

    def _wake(self) -> None:
        self._pending |= self._tables()
        self._moved.set()


@dataclass(frozen=True)
class _Read:
    """A table's last read that went to the server: the epoch of the tick
    before it, and when it started."""

    epoch: str
    at: float


class WatchedReads:
    """Which reads the watcher answers, and the database check of each read
    (module docstring). ``database_now`` reads the database's identity on the
    spot, for when no fresh tick has it."""

    def __init__(self, watcher: VersionWatcher, database_now: Callable[[], Awaitable[str]]) -> None:
        self.watcher = watcher
        self._database_now = database_now
        self._reads: dict[str, _Read] = {}  # table (lower case) -> its last complete read

    def skip(self, info: TableInfo, since: int, upto: int | None, after: object) -> ChangePage | None:
        """An empty page with ``since`` as its bound when a read from ``since``
        is known to find nothing; None: the read goes to the server."""
        if upto is not None or after is not None or self._quiet(info.table, since) is None:
            return None
        return ChangePage(rows=[], next_version=since)

    def quiet_for(self, info: TableInfo, since: int) -> float:
        """How long a read from ``since`` is known to find nothing unless the
        watcher wakes the table (the rest of ``QUIET_READ_LIMIT``), or 0."""
        read = self._quiet(info.table, since)
        return 0.0 if read is None else max(0.0, read.at + QUIET_READ_LIMIT - time.monotonic())

    def _quiet(self, table: str, since: int) -> _Read | None:
        seen, read = self.watcher.latest(), self._reads.get(table.lower())
        if seen is None or read is None or seen.tick.version != since or seen.tick.epoch != read.epoch:
            return None
        return read if time.monotonic() - read.at < QUIET_READ_LIMIT else None

    async def begin(self, info: TableInfo, fresh: bool) -> _Read | None:
        """A read goes to the server: its start. A ``fresh`` one (not a
        continued page) has the database checked first."""
        self._reads.pop(info.table.lower(), None)  # only its outcome may allow skipping again
        seen = self.watcher.latest()
        if fresh:
            await self._check_database(info, None if seen is None else seen.tick.database)
        return None if seen is None else _Read(seen.tick.epoch, time.monotonic())

    def settle(self, info: TableInfo, start: _Read | None, page: ChangePage) -> None:
        if start is not None and not page.more:
            self._reads[info.table.lower()] = start

    async def _check_database(self, info: TableInfo, database: str | None) -> None:
        """SchemaError when the table was described in another database than
        this one is now (restored, failed over): it is described again."""
        described = identity_parts(info.identity)
        if not all(label in described for label in _DATABASE_LABELS):
            return  # an identity without the database's part (hidden parts are still compared)
        was = "; ".join(f"{label} {described[label]}" for label in _DATABASE_LABELS)
        now = database if database is not None else await self._database_now()
        if now != was:
            raise SchemaError(
                f"{info.table}: {identity_change(was, now)} since the table was described "
                f"({was}, now {now}): it will be described again and snapshotted"
            )


ReadChanges = TypeVar("ReadChanges", bound=Callable[..., Awaitable[ChangePage]])


def watched(read: ReadChanges) -> ReadChanges:
    """``MssqlSource.read_changes`` with the watcher's part around it: a read
    known to find nothing is answered at once; any other has the database
    checked first and, completed, allows skipping the next (``WatchedReads``).
    The source keeps its ``WatchedReads`` as ``_watch``."""

    @functools.wraps(read)
    async def read_changes(self: Any, info: TableInfo, since: int, **kwargs: Any) -> ChangePage:
        watch: WatchedReads = self._watch
        upto, after = kwargs.get("upto"), kwargs.get("after")
        skipped = watch.skip(info, since, upto, after)
        if skipped is not None:
            return skipped
        start = await watch.begin(info, fresh=upto is None and after is None)
        page = await read(self, info, since, **kwargs)
        watch.settle(info, start, page)
        return page

    return cast(ReadChanges, read_changes)
