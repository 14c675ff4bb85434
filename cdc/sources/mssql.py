"""The SQL Server source: Change Tracking read through pyodbc.

``MssqlSource`` composes the SQL Server family, whose seams match the
PostgreSQL one's:

- ``mssql_dsn``: the ODBC connection string, where it points, its password
  kept out of messages;
- ``mssql_errors``: pyodbc errors mapped onto ``cdc.errors``;
- ``mssql_link``: one connection and the one thread allowed to touch it;
  ``mssql_readers``: the idle reader connections reads run on;
- ``mssql_catalog``: describing a table, and the shape fingerprints that tell
  a running sidecar it changed (SQLSERVER.md, "When a table changes shape");
- ``mssql_reads``: what a read checks and decodes; ``mssql_paging``: the
  pages of a read of changes, one SNAPSHOT transaction, its backlog in
  tempdb; ``mssql_snapshot``: a table's snapshot, in resumable chunks;
- ``mssql_tracking``: enable, disable, status; ``mssql_grants``: what the
  sidecar's user is granted, and the tables the login may not enable;
- ``mssql_doctor``: what will go wrong;
- ``mssql_sql``: the T-SQL text; ``mssql_types``: the type mapping;
- ``mssql_watcher``: the per-database version watcher, which wakes idle
  tables and answers the reads that cannot find anything.

Connections, each with its own job: one link for describe, versions and
administration; idle readers for reads, a paged read holding its SNAPSHOT
transaction (and its backlog) open on one of them until its last page; one
per snapshot; one for the version watcher's ticks (started by the first
``wait_for_changes``: the pipeline's listen loop).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, TypeVar

from cdc.config import SourceConfig, TableConfig
from cdc.errors import MissingColumn, SchemaError, TrackingNotEnabled
from cdc.sources import mssql_grants, mssql_keyed
from cdc.sources import mssql_sql as sql
from cdc.sources.base import (
    ChangePage,
    CleanupScope,
    Cursor,
    Finding,
    KeyedRows,
    SnapshotPage,
    TableInfo,
    TrackingStatus,
)
from cdc.sources.mssql_catalog import (
    DescribedTable,
    TableName,
    describe,
    not_tracked,
    read_fingerprints,
    shape_change,
)
from cdc.sources.mssql_doctor import doctor
from cdc.sources.mssql_held import HeldRead, HeldReads
from cdc.sources.mssql_link import (
    Link,
    fetch_scalar,
    open_connection,
    prepare_connection,
)
from cdc.sources.mssql_paging import first_page, next_page
from cdc.sources.mssql_readers import Readers
from cdc.sources.mssql_reads import change_cursor, decode_change, unreadable_in
from cdc.sources.mssql_snapshot import read_snapshot
from cdc.sources.mssql_tracking import database_settings, disable, enable, status
from cdc.sources.mssql_watcher import VersionWatcher, WatchedReads, read_database_identity, read_tick, watched

T = TypeVar("T")


class MssqlSource:
    """``ChangeSource`` for SQL Server Change Tracking (see the module docstring)."""

    kind = "mssql"

    def __init__(self, config: SourceConfig, *, connector: Callable[[], Any] | None = None) -> None:
        self.config = config
        self._connector = connector
        self._link = Link(self._open_connection, config.dsn, "cdc-mssql")
        self._tables: dict[str, DescribedTable] = {}
        # Reads run on readers of their own: a paged read holds its SNAPSHOT
        # transaction open on one (``_held``, by table) until its last page, while
        # other tables' reads, describe and the rest go on elsewhere.
        self._readers = Readers(self._open_connection, config.dsn)
        # table (lower case) -> its paged read, rolled back should its caller go (mssql_held)
        self._held = HeldReads(lambda link: self._readers.release(link, rollback=True))
        self._watch_link = Link(self._open_connection, config.dsn, "cdc-mssql-watch")
        tables = lambda: {described.info.table for described in self._tables.values()}  # noqa: E731
        self._watcher = VersionWatcher(lambda: self._watch_link.run(read_tick), tables)
        self._watch = WatchedReads(self._watcher, lambda: self._link.run(read_database_identity))

    # -- connections

    def _open_connection(self) -> Any:
        connector = self._connector
        return prepare_connection(connector(), self.config) if connector else open_connection(self.config)

    async def connect(self) -> None:
        await self._link.open()

    async def close(self) -> None:
        """Close every connection; a paged read still held is rolled back."""
        await self._watcher.close()
        await self._watch_link.close()
        await self._held.settled()
        links = [held.link for held in self._held.take_all()] + self._readers.take_all()
        try:
            for link in links:
                await link.close()  # rolls back an open transaction first
        finally:
            await self._link.close()

    # -- tables

    async def describe(self, table_config: TableConfig) -> TableInfo:
        table_name = TableName(table_config.table, table_config.schema, table_config.name)
        described = await self._link.run(
            lambda conn: describe(conn, table_name, table_config.columns), table_config.table
        )
        self._tables[table_config.table.lower()] = described
        return described.info

    async def fingerprints(self, tables: Sequence[TableConfig]) -> dict[str, str | None]:
        """One statement for all ``tables`` (``mssql_sql_catalog.FINGERPRINT``), on the
        describe link: no SET first, as that link only ever runs at READ
        COMMITTED (describe sets it; SNAPSHOT transactions run on readers)."""
        names = [TableName(t.table, t.schema, t.name) for t in tables]
        if not names:
            return {}
        found = await self._link.run(lambda conn: read_fingerprints(conn, names))
        return {n.table: None if f is None else f.fingerprint for n, f in zip(names, found, strict=True)}

    async def _described(self, info: TableInfo) -> DescribedTable:
        """The described table behind ``info``: the one ``describe`` cached when
        it is ``info``'s, else described again; SchemaError when the table is
        no longer what ``info`` says (a caller reading with an older TableInfo
        must describe the table again, not read it with a stale shape)."""
        known = self._tables.get(info.table.lower())
        if known is not None and known.tracked and known.info == info:
            return known  # (an untracked table is described again: tracking may be on by now)
        table_name = TableName(info.table, info.schema, info.name)
        try:
            described = await self._link.run(
                lambda conn: describe(conn, table_name, info.column_names), info.table
            )
        except MissingColumn as exc:  # a column of ``info``, not of the config: gone since
            raise SchemaError(
                f"{info.table}: the table changed since it was described (column {exc.column} is gone): "
                "it will be described again"
            ) from exc
        if described.info != info:
            raise SchemaError(
                f"{info.table}: the table changed since it was described ({shape_change(info, described.info)}): "
                "it will be described again"
            )
        self._tables[info.table.lower()] = described
        return described

    async def _tracked(self, info: TableInfo) -> DescribedTable:
        """The described table behind ``info``; TrackingNotEnabled unless it is tracked."""
        described = await self._described(info)
        if not described.tracked:
            raise TrackingNotEnabled(not_tracked(info.table, info.schema, info.name))
        return described

    # -- versions and changes

    async def current_version(self) -> int:
        version = await self._link.run(lambda conn: fetch_scalar(conn, sql.CURRENT_VERSION))
        if version is None:
            raise TrackingNotEnabled("CHANGE_TRACKING_CURRENT_VERSION() is NULL: change tracking is off")
        return int(version)

    @watched  # a read known to find nothing is answered at once; the database checked (mssql_watcher)
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

        Every page of one read comes from one SNAPSHOT transaction (``HeldRead``):
        the first page opens it on a reader connection of its own and checks the
        versions; while more pages follow it stays open, and a call that
        continues the read (same ``since``, ``upto`` = its bound, ``after`` = the
        cursor last returned) reads the next page in it; the last page commits
        it. Any other read of the table rolls it back first. Should the held
        transaction be gone (an error, ``close``), a continuation starts a new
        transaction from ``(upto, after)``: still complete, but a row changed
        again in between then arrives with the next read, relative to ``upto``."""
        if limit < 1:
            raise ValueError("limit must be at least 1")
        described = await self._tracked(info)
        held = self._held.take(info.table.lower())
        if held is not None and held.continues(since, upto, after):
            link = held.link
            page = await self._readers.run(link, next_page(held, described, limit), info.table)
        else:
            if held is not None:
                await self._readers.release(held.link, rollback=True)  # the caller started another read
            link = self._readers.take()
            page = await self._readers.run(link, first_page(described, since, limit, upto, after), info.table)
        rows = page.rows
        try:
            changes = [decode_change(described, since, row) for row in rows[:limit]]
            await self._check_unreadable(described, [c.values for c in changes])
        except BaseException:
            # a table changed under the read, a cancellation, anything: the reader goes
            # back with its transaction rolled back, never left holding it (tempdb)
            await self._readers.release(link, rollback=True)
            raise
        if len(rows) <= limit:
            await self._readers.release(link, rollback=False)  # committed with the last page
            return ChangePage(rows=changes, next_version=page.bound)
        cursor = change_cursor(described.shape, rows[limit - 1])
        continued = HeldRead(link, page.conn, since, page.bound, cursor, page.column_ids, page.backlog_row)
        self._held.hold(info.table.lower(), continued)
        return ChangePage(rows=changes, next_version=page.bound, more=True, cursor=cursor)

    async def _check_unreadable(
        self, described: DescribedTable, rows: Sequence[dict[str, Any] | None]
    ) -> None:
        """An ``Unreadable`` value dead-letters its row (the mapper) while the table is as
        described; if its shape changed (ALTER COLUMN), SchemaError: it is described again."""
        info = described.info
        if (problem := unreadable_in(info.table, *rows)) is None:
            return
        name = TableName(info.table, info.schema, info.name)
        [found] = await self._link.run(lambda conn: read_fingerprints(conn, [name]), info.table)
        if found is None or found.fingerprint != info.fingerprint:
            raise SchemaError(problem)

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
        """Keyset pages in chunks of SNAPSHOT transactions (``mssql_snapshot``); ``encoded`` is ignored."""
        described = await self._tracked(info)
        link = Link(self._open_connection, self.config.dsn, "cdc-mssql-snapshot")

        async def check_rows(rows: Sequence[dict[str, Any] | None]) -> None:
            await self._check_unreadable(described, rows)

        pages = read_snapshot(link, described, page_size, check_rows, after=after, start=start, until=until)
        try:
            async for page in pages:
                yield page
        finally:
            await link.close()  # rolls back first when the snapshot was abandoned or failed

    async def read_rows(self, info: TableInfo, keys: Sequence[dict[str, Any]]) -> KeyedRows:
        """The current rows of ``keys`` in one SNAPSHOT transaction, the
        version read first, on a reader (``mssql_keyed``)."""
        described = await self._tracked(info)
        link = self._readers.take()
        found = await self._readers.run(
            link, lambda conn: mssql_keyed.read_rows(conn, described, keys), info.table
        )
        self._readers.give_back(link)  # committed (or rolled back, on an error) by mssql_keyed
        await self._check_unreadable(described, found.rows)
        return found

    async def wait_for_changes(self, timeout: float) -> set[str]:
        """Described tables, once version, identity or tracking moved; empty after ``timeout`` (mssql_watcher)."""
        return await self._watcher.wait(timeout)

    def quiet_for(self, info: TableInfo, since: int) -> float:
        return self._watch.quiet_for(info, since)  # how long a read finds nothing (mssql_watcher)

    async def retention(self) -> float | None:
        """The database's CHANGE_RETENTION (sys.change_tracking_databases); None
        with AUTO_CLEANUP OFF ("Data is removed only if the Auto Clean-Up value
        is True": learn.microsoft.com, Database Properties (ChangeTracking
        Page)) or when the view hides the row from the login (it needs VIEW ANY
        DATABASE unless it owns the database: sys.change_tracking_databases)."""
        settings = await self._link.run(database_settings)
        return settings.retention if settings.auto_cleanup else None

    async def cleanup(self, retention: float, scope: CleanupScope | None = None) -> int:
        """Nothing to do, nor to scope: SQL Server cleans its change tracking up itself
        (AUTO_CLEANUP), with the database's one CHANGE_RETENTION (docs/SQLSERVER.md)."""
        return 0

    # -- setting tracking up

    async def tracking_enable(self, tables: Sequence[TableConfig]) -> list[str]:
        opener = self._open_connection  # ALLOW_SNAPSHOT_ISOLATION ON waits on a connection of its own

        def checked_enable(conn: Any) -> list[str]:
            mssql_grants.check_alterable(conn, tables)  # every table it may not ALTER at once, first
            return enable(conn, tables, self.config.retention, opener)

        return await self._link.run(checked_enable)

    async def check_grantee(self, role: str) -> None:
        await self._link.run(lambda conn: mssql_grants.check_user(conn, role))

    async def grant_runtime(self, tables: Sequence[TableConfig], role: str) -> list[str]:
        """SELECT and VIEW CHANGE TRACKING on each table to the database user ``role``."""
        return await self._link.run(lambda conn: mssql_grants.grant_runtime(conn, tables, role))

    async def tracking_disable(self, tables: Sequence[TableConfig]) -> list[str]:
        return await self._link.run(lambda conn: disable(conn, tables))

    async def tracking_status(self, tables: Sequence[TableConfig]) -> list[TrackingStatus]:
        return await self._link.run(lambda conn: status(conn, tables))

    async def doctor(self, tables: Sequence[TableConfig]) -> list[Finding]:
        known, retention = dict(self._tables), self.config.retention
        return await self._link.run(lambda conn: doctor(conn, tables, retention, known))
