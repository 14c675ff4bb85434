"""The PostgreSQL change source (psycopg 3, asyncio).

``PostgresSource`` composes the PostgreSQL family, whose seams match the
SQL Server one's:

- ``pg_dsn``: where a DSN points, its password kept out of messages;
- ``pg_errors``: psycopg errors mapped onto ``cdc.errors``;
- ``pg_catalog``: finding a table, its columns and primary key;
- ``pg_reads``: changes and snapshots, each in one snapshot;
- ``pg_tracking``: the tracking ``cdc tracking enable`` installs, and its status;
- ``pg_doctor``: what will go wrong;
- ``pg_types``: the type mapping; ``pg_listen``: wake-ups, and reads not sent.

Changes come from the tracking that ``cdc tracking enable`` installs
(``cdc.sources.pg_tracking``): per table a net-change table kept by triggers,
whose versions are the writing transactions' ids. A read runs in one
REPEATABLE READ, READ ONLY transaction, whose snapshot bounds it:

    bound = pg_snapshot_xmin(snapshot) - 1

Every transaction below ``xmin`` has ended, so every entry with a version at
or below the bound is final and visible, and no transaction can still commit
one there: the bound is the consistent ``next_version`` of DESIGN.md §2. A
long-running transaction holds ``xmin`` back, which delays changes but never
loses one. The net entries are joined to the source table in the same
snapshot, so the values are those of the entry's version.

Connections, each with its own job:

- the reader, shared by all reads (an ``asyncio.Lock`` keeps one transaction
  at a time on it), reconnected when it breaks; its session also keeps the
  rest of a paged read (``cdc.sources.pg_reads.HeldRead``);
- one per snapshot, holding the snapshot's transaction open across pages;
- one short-lived per administrative call (enable, disable, cleanup);
- one LISTEN connection for wake-ups (``cdc.sources.pg_listen``), unless
  the source's ``notify`` is false; it also lets a read that cannot find
  anything go unsent (``pg_listen.QuietReads``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import psycopg

from cdc.config import SourceConfig, TableConfig
from cdc.errors import ConnectError, SchemaError
from cdc.sources import pg_catalog, pg_doctor, pg_reads, pg_tracking
from cdc.sources.base import (
    ChangePage,
    Column,
    Cursor,
    Finding,
    SnapshotPage,
    TableInfo,
    TrackingStatus,
)
from cdc.sources.pg_catalog import CatalogTable, Connection
from cdc.sources.pg_errors import LINK_ERRORS, connect_error, map_error
from cdc.sources.pg_listen import NotificationListener, QuietReads, ReadStart
from cdc.sources.pg_reads import HeldRead
from cdc.sources.pg_types import check_supported, prepare_session

MIN_SERVER_VERSION = 130000  # pg_current_xact_id() and pg_current_snapshot()


class PostgresSource:
    """``ChangeSource`` for PostgreSQL; see the module docstring."""

    kind = "postgres"

    def __init__(self, config: SourceConfig) -> None:
        self._config = config
        self._schema = config.tracking_schema
        self._reader: Connection | None = None
        self._lock = asyncio.Lock()
        self._held: dict[str, HeldRead] = {}  # table -> the rest of a paged read
        self._paged: set[str] = set()  # tables whose last read took more than one page
        self._whole_reads: dict[TableInfo, bytes] = {}  # whole_read_query, composed once per table
        self._listener = NotificationListener(self._open, channel=config.tracking_schema)
        self._quiet = QuietReads(self._listener)
        self.reads_skipped = 0  # reads answered without a round trip (see pg_listen)

    # -- connections -------------------------------------------------------

    async def connect(self) -> None:
        """Open the reader; failing here is ``ConnectError`` (exit code 3)."""
        if self._reader is not None and not self._reader.closed:
            return
        try:
            self._reader = await self._open(reader=True)
        except (psycopg.Error, OSError) as exc:
            raise connect_error(exc, self._config.dsn) from None
        version = self._reader.info.server_version
        if version < MIN_SERVER_VERSION:
            await self.close()
            raise ConnectError(
                f"PostgreSQL {version // 10000} is not supported: version 13 or later is needed"
            )

    async def close(self) -> None:
        await self._listener.close()
        self._quiet.clear()
        self._held.clear()  # held cursors live in the reader's session
        reader, self._reader = self._reader, None
        if reader is not None:
            await reader.close()

    async def _open(self, reader: bool = False) -> Connection:
        return await _open_session(self._config, reader)

    @asynccontextmanager
    async def _guard(self, what: str) -> AsyncIterator[None]:
        """Map driver errors onto cdc.errors, dropping a reader that broke."""
        try:
            yield
        except (psycopg.Error, OSError) as exc:
            reader = self._reader
            if isinstance(exc, LINK_ERRORS) and reader is not None and (reader.broken or reader.closed):
                self._reader = None
            raise map_error(exc, self._config.dsn, what) from exc

    @asynccontextmanager
    async def _reading(self, what: str, transaction: bool = True) -> AsyncIterator[Connection]:
        """The reader, alone, inside a REPEATABLE READ READ ONLY transaction."""
        async with self._lock, self._guard(what):
            if self._reader is None or self._reader.closed or self._reader.broken:
                self._reader = await self._open(reader=True)
            if not transaction:
                yield self._reader
                return
            async with self._reader.transaction():
                yield self._reader

    @asynccontextmanager
    async def _administering(self, what: str) -> AsyncIterator[Connection]:
        """A short-lived connection inside a read-write transaction."""
        async with self._guard(what):
            conn = await self._open()
            try:
                async with conn.transaction():
                    yield conn
            finally:
                await conn.close()

    # -- tables --------------------------------------------------------------

    async def describe(self, table_config: TableConfig) -> TableInfo:
        async with self._reading(f"describe {table_config.table}") as conn:
            found = await pg_catalog.find_table(conn, table_config.schema, table_config.name)
            if found is None:
                raise await pg_catalog.missing_table(conn, table_config.schema, table_config.name)
        info = _table_info(table_config, found)
        # what the notify trigger sends; a partitioned table is not notified of its partitions' writes
        self._quiet.watch(table_config.table, None if found.partitioned else found.qualified)
        return info

    async def fingerprints(self, tables: Sequence[TableConfig]) -> dict[str, str | None]:
        raise NotImplementedError("issue 12: being written")

    async def current_version(self) -> int:
        async with self._reading("read the current version", transaction=False) as conn:
            return await pg_reads.read_bound(conn)

    # -- changes -------------------------------------------------------------

    async def read_changes(
        self,
        info: TableInfo,
        since: int,
        *,
        limit: int,
        upto: int | None = None,
        after: Cursor | None = None,
    ) -> ChangePage:
        """Net changes after ``since``, at most ``limit`` rows, in (version, key) order.

        The pages of one read come from one snapshot (``pg_reads.HeldRead``).
        Should the held rest be gone (the reader reconnected), the read goes on
        from ``(upto, after)`` in a new transaction: still complete, since no
        entry can enter ``(since, upto]`` any more, but a row changed again
        after ``upto`` in between then arrives with the next read, relative to
        ``upto``. Cleanup and TRUNCATE are caught by every transaction's check."""
        quiet_bound = self._quiet.skip(info.table, since) if upto is None and after is None else None
        if quiet_bound is not None:
            self.reads_skipped += 1
            return ChangePage([], quiet_bound)
        start = self._quiet.begin(info.table)
        held = self._held.pop(info.table, None)
        async with self._reading(f"read changes of {info.table}", transaction=False) as conn:
            if held is not None and held.continues(conn, since, upto, after):
                page = await held.next_page(info, limit)
            else:
                if held is not None:
                    await held.close()  # the caller gave up that read
                page, held = await self._new_read(conn, info, since, limit, upto, after, start)
            if held is not None and page.more:
                self._held[info.table] = held
            elif held is not None:
                await held.close()  # the read is complete
        return page

    async def _new_read(
        self,
        conn: Connection,
        info: TableInfo,
        since: int,
        limit: int,
        upto: int | None,
        after: Cursor | None,
        start: ReadStart | None,
    ) -> tuple[ChangePage, HeldRead | None]:
        """The first page: in one statement when the read may fit one, else in a transaction."""
        whole = None
        if upto is None and after is None and info.table not in self._paged:
            whole = await pg_reads.whole_read(conn, self._schema, info, since, limit, self._whole_reads)
        if whole is not None:
            page, complete = whole
            if complete and not page.rows:
                self._quiet.settle(info.table, start, page.next_version)
            return page, None
        page, held = await pg_reads.first_page(conn, self._schema, info, since, limit, upto, after)
        (self._paged.add if page.more else self._paged.discard)(info.table)
        return page, held

    def quiet_for(self, info: TableInfo, since: int) -> float:
        """How long a read from ``since`` is known to find nothing unless the
        table's notification arrives, or 0 (``pg_listen.QuietReads``)."""
        return self._quiet.quiet_for(info.table, since)

    # -- snapshots -----------------------------------------------------------

    async def snapshot(self, info: TableInfo, *, page_size: int) -> AsyncIterator[SnapshotPage]:
        """The whole table in one REPEATABLE READ transaction, keyset-paged on
        the primary key; the first page is yielded even when the table is empty,
        so that the caller always learns the version."""
        async with self._guard(f"snapshot {info.table}"):
            conn = await self._open(reader=True)
        try:
            async with self._guard(f"snapshot {info.table}"), conn.transaction():
                version = await pg_reads.snapshot_version(conn, self._schema, info)
                total = await pg_reads.estimated_rows(conn, info)
                last: tuple[Any, ...] | None = None
                while True:
                    records = await pg_reads.snapshot_records(conn, info, last, page_size)
                    if records or last is None:
                        rows = [dict(zip(info.column_names, r, strict=True)) for r in records]
                        yield SnapshotPage(version, rows, total)
                    if len(records) < page_size:
                        return
                    last = tuple(records[-1][: len(info.primary_key)])
        finally:
            await conn.close()

    # -- notifications and upkeep --------------------------------------------

    async def wait_for_changes(self, timeout: float) -> set[str]:
        """Tables notified within ``timeout``; with ``notify: false`` nothing is
        listened to: sleep, report nothing, and the trackers poll on their backoff."""
        if not self._config.notify:
            if timeout > 0:
                await asyncio.sleep(timeout)
            return set()
        return await self._listener.wait(timeout)

    async def cleanup(self, retention: float) -> int:
        """Delete tracking entries older than ``retention`` seconds that every reader
        could have read; checkpoints before them expire."""
        async with self._administering("cleanup") as conn:
            return await pg_tracking.cleanup(conn, self._schema, retention)

    # -- tracking administration ---------------------------------------------

    async def tracking_enable(self, tables: Sequence[TableConfig]) -> list[str]:
        async with self._administering("enable change tracking") as conn:
            await pg_tracking.lock_schema(conn, self._schema)
            await pg_tracking.install_schema(conn, self._schema)
            done = []
            for table_config in tables:
                found = await pg_catalog.find_table(conn, table_config.schema, table_config.name)
                if found is None:
                    raise await pg_catalog.missing_table(conn, table_config.schema, table_config.name)
                done.append(await pg_tracking.enable_table(conn, self._schema, found))
        return done

    async def tracking_disable(self, tables: Sequence[TableConfig]) -> list[str]:
        async with self._administering("disable change tracking") as conn:
            await pg_tracking.lock_schema(conn, self._schema)
            done = [await pg_tracking.disable_table(conn, self._schema, t.schema, t.name) for t in tables]
            if await pg_tracking.drop_schema_if_unused(conn, self._schema):
                done.append(f"schema {self._schema}: dropped (no table is tracked any more)")
        return done

    async def tracking_status(self, tables: Sequence[TableConfig]) -> list[TrackingStatus]:
        async with self._reading("read tracking status") as conn:
            version = await pg_reads.read_bound(conn)
            return [await pg_tracking.table_status(conn, self._schema, t, version) for t in tables]

    async def doctor(self, tables: Sequence[TableConfig]) -> list[Finding]:
        """What the source can see: tracking installed, triggers in place, privileges,
        and transactions old enough to hold every table's changes back."""
        async with self._reading("doctor") as conn:
            return await pg_doctor.doctor(conn, self._schema, tables)


def _table_info(table_config: TableConfig, found: CatalogTable) -> TableInfo:
    """The published columns, primary key first, each checked for a JSON mapping."""
    if not found.primary_key:
        raise SchemaError(f"{table_config.table}: the table has no primary key; cdc-sync needs one")
    wanted = (
        list(table_config.columns) if table_config.columns is not None else [c.name for c in found.columns]
    )
    names = [*found.primary_key, *(c for c in wanted if c not in found.primary_key)]
    columns = []
    for name in names:
        column = found.column(name)
        if column is None:
            known = ", ".join(c.name for c in found.columns)
            raise SchemaError(f"{table_config.table}: no column {name!r} (the table has: {known})")
        check_supported(table_config.table, column)
        columns.append(Column(name, column.type_name, not column.not_null))
    return TableInfo(table_config.table, found.schema, found.name, found.primary_key, tuple(columns))


async def _open_session(config: SourceConfig, reader: bool) -> Connection:
    """A new autocommit connection with the session settings; a reader's
    transactions are REPEATABLE READ, READ ONLY."""
    conn = await psycopg.AsyncConnection.connect(
        config.dsn,
        autocommit=True,
        connect_timeout=max(1, round(config.connect_timeout)),
        fallback_application_name="cdc-sync",
    )
    try:
        await prepare_session(conn, config.query_timeout)
        if reader:
            await conn.set_isolation_level(psycopg.IsolationLevel.REPEATABLE_READ)
            await conn.set_read_only(True)
    except BaseException:
        await conn.close()
        raise
    return conn
