"""The PostgreSQL change source (psycopg 3, asyncio).

``PostgresSource`` composes the PostgreSQL family, whose seams match the
SQL Server one's:

- ``pg_dsn``: where a DSN points, its password kept out of messages;
- ``pg_errors``: psycopg errors mapped onto ``cdc.errors``;
- ``pg_catalog``: finding a table, its columns and primary key;
- ``pg_shape``: a table's fingerprint, and the ``TableInfo`` made of it;
- ``pg_reads``: changes and snapshots, each in one snapshot;
- ``pg_tracking``: the tracking ``cdc tracking enable`` installs;
- ``pg_status``: whether a table's tracking is in place;
- ``pg_doctor``: what will go wrong; ``pg_grants``: what the runtime role needs;
- ``pg_sessions``: its connections, and the errors that leave them;
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

Connections, each with its own job (``pg_sessions``):

- the reader, shared by all reads (an ``asyncio.Lock`` keeps one transaction
  at a time on it), reconnected when it breaks; its session also keeps the
  rest of a paged read (``cdc.sources.pg_reads.HeldRead``);
- one per snapshot, holding the snapshot's transaction open across pages;
- one short-lived per administrative call (enable, disable, cleanup);
- one LISTEN connection for wake-ups (``cdc.sources.pg_listen``), unless
  the source's ``notify`` is false; it also lets a read that cannot find
  anything go unsent (``pg_listen.QuietReads``).

Tables change shape while the sidecar runs (ALTER, DROP, RENAME). A read or
snapshot that fails because of it raises ``SchemaError`` ("the table changed
while it was read"), and the table is described again. psycopg prepares a
query it has run five times and keeps the prepared statement; once a table's
columns change type, that statement fails for good ("cached plan must not
change result type"), so the reader is closed after that error, and when a
table described again differs from what it was (the new queries may have the
same text).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from cdc.config import SourceConfig, TableConfig
from cdc.errors import SourceError
from cdc.sources import (
    pg_catalog,
    pg_doctor,
    pg_grants,
    pg_keyed,
    pg_reads,
    pg_retention,
    pg_shape,
    pg_snapshot,
    pg_status,
    pg_tracking,
    pg_types,
)
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
from cdc.sources.pg_catalog import Connection
from cdc.sources.pg_listen import NotificationListener, QuietReads, ReadStart
from cdc.sources.pg_read_encoded import EncodedRead, EncodedReads
from cdc.sources.pg_reads import HeldRead
from cdc.sources.pg_sessions import Sessions

# Each table's fingerprint (None: no such table), in one statement (logical capture adds its publication's).
Shapes = Callable[[Connection, Sequence[TableConfig]], Awaitable[list[str | None]]]


class PostgresSource:
    """``ChangeSource`` for PostgreSQL; see the module docstring."""

    kind = "postgres"

    def __init__(self, config: SourceConfig) -> None:
        self._config = config
        self._schema = config.tracking_schema
        self._sessions = Sessions(config)
        self._held = self._sessions.held  # table -> the rest of a paged read
        self._paged: set[str] = set()  # tables whose last read took more than one page
        self._whole_reads: dict[TableInfo, bytes] = {}  # whole_read_query, composed once per table
        self.encoded_reads = EncodedReads()  # reads whose JSON text the server writes, once on
        self._partitioned: set[str] = set()  # tables described as partitioned (relkind 'p')
        self._described: dict[str, TableInfo] = {}  # table -> what describe last returned
        self._listener = NotificationListener(self._sessions.open, channel=config.tracking_schema)
        self._quiet = QuietReads(self._listener)
        self.reads_skipped = 0  # reads answered without a round trip (see pg_listen)
        self._fingerprints: Shapes = lambda conn, tables: pg_shape.fingerprints(conn, self._schema, tables)

    # -- connections (``pg_sessions``) ------------------------------------------

    async def connect(self) -> None:
        """Open the reader; failing here is ``ConnectError`` (exit code 3)."""
        await self._sessions.connect()

    async def close(self) -> None:
        await self._listener.close()
        self._quiet.clear()
        await self._sessions.drop_reader()

    # -- tables --------------------------------------------------------------

    async def describe(self, table_config: TableConfig) -> TableInfo:
        """The table as it is now, its fingerprint read first: should it change
        while the catalog is read, the next ``fingerprints`` differs from it."""
        async with self._sessions.reading(f"describe {table_config.table}") as conn:
            fingerprint = (await self._fingerprints(conn, [table_config]))[0]
            found = await pg_catalog.find_table(conn, table_config.schema, table_config.name)
            if found is None:
                renamed = await pg_status.renamed_to(conn, self._schema, table_config.table)
                raise await pg_catalog.missing_table(conn, table_config.schema, table_config.name, renamed)
        info = pg_shape.table_info(table_config, found, fingerprint or "")
        await self._forget_shape(info)
        # what the notify trigger sends; a partitioned table is not notified of its partitions' writes
        self._quiet.watch(table_config.table, None if found.partitioned else found.qualified)
        (self._partitioned.add if found.partitioned else self._partitioned.discard)(info.table)
        return info

    def _ordinary(self, info: TableInfo) -> bool:
        """Whether reads take ``ONLY`` the table's own rows (``pg_reads.source_relation``)."""
        return info.table not in self._partitioned

    async def _forget_shape(self, info: TableInfo) -> None:
        """A table described again: its queries composed for what it was go, and,
        when it differs from what it was, the reader with its prepared statements."""
        before = self._described.get(info.table)
        self._described[info.table] = info
        self._whole_reads = {i: q for i, q in self._whole_reads.items() if i.table != info.table or i == info}
        self.encoded_reads.forget(info)
        if before is not None and before != info:
            async with self._sessions.lock:
                await self._sessions.drop_reader()

    async def fingerprints(self, tables: Sequence[TableConfig]) -> dict[str, str | None]:
        """Each table's shape now, in one statement (``pg_shape``)."""
        async with self._sessions.reading("read table fingerprints", transaction=False) as conn:
            return dict(zip((t.table for t in tables), await self._fingerprints(conn, tables), strict=True))

    async def current_version(self) -> int:
        async with self._sessions.reading("read the current version", transaction=False) as conn:
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
        held = self._held.get(info.table)  # popped under the lock: a caller cancelled meanwhile leaves it
        continuing = held is not None and held.continues(self._sessions.reader, since, upto, after)
        what = f"read changes of {info.table}"
        async with self._sessions.reading(what, False, info.table, continuing=continuing) as conn:
            held = self._held.pop(info.table, None)
            if held is not None and held.continues(conn, since, upto, after):
                page = await held.next_page(info, limit)
            else:
                if held is not None:
                    await held.close()  # the caller gave up that read
                encoded = await self.encoded_reads.get(conn, info)
                page, held = await self._new_read(conn, info, since, limit, upto, after, start, encoded)
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
        encoded: EncodedRead | None = None,
    ) -> tuple[ChangePage, HeldRead | None]:
        """The first page: in one statement when the read may fit one, else in a transaction."""
        whole = None
        ordinary = self._ordinary(info)
        if upto is None and after is None and info.table not in self._paged:
            whole = await pg_reads.whole_read(
                conn, self._schema, info, since, limit, self._whole_reads, ordinary=ordinary, encoded=encoded
            )
        if whole is not None:
            page, complete = whole
            if complete and not page.rows:
                self._quiet.settle(info.table, start, page.next_version)
            return page, None
        page, held = await pg_reads.first_page(
            conn, self._schema, info, since, limit, upto, after, ordinary=ordinary, encoded=encoded
        )
        (self._paged.add if page.more else self._paged.discard)(info.table)
        return page, held

    def quiet_for(self, info: TableInfo, since: int) -> float:
        """How long a read from ``since`` is known to find nothing unless the
        table's notification arrives, or 0 (``pg_listen.QuietReads``)."""
        return self._quiet.quiet_for(info.table, since)

    # -- snapshots -----------------------------------------------------------

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
        """The whole table (after the key ``after``, within ``start``..``until``, when given) in one
        REPEATABLE READ transaction, keyset-paged on the primary key; the first
        page is yielded even when the table is empty, so that the caller always
        learns the version. ``encoded``: the server writes most columns' JSON
        text (``pg_snapshot``)."""
        async with self._sessions.guard(f"snapshot {info.table}"):
            conn = await self._sessions.open(reader=True)
        try:
            async with self._sessions.guard(f"snapshot {info.table}", info.table), conn.transaction():
                await pg_reads.lock_source(conn, info)
                version = await pg_reads.snapshot_version(conn, self._schema, info)
                ordinary = self._ordinary(info)
                total = await pg_reads.estimated_rows(conn, info, ordinary=ordinary)
                bounds = pg_snapshot.Bounds(after, start, until)
                pages = pg_snapshot.encoded_pages if encoded else pg_snapshot.plain_pages
                async for page in pages(conn, info, version, total, page_size, bounds, ordinary):
                    yield page
        finally:
            await conn.close()

    async def read_rows(self, info: TableInfo, keys: Sequence[dict[str, Any]]) -> KeyedRows:
        """The current rows of ``keys``, the version read first (``pg_keyed``)."""
        async with self._sessions.reading(f"read rows of {info.table} by key", True, info.table) as conn:
            return await pg_keyed.read_rows(conn, self._schema, info, keys, ordinary=self._ordinary(info))

    # -- notifications and upkeep --------------------------------------------

    async def wait_for_changes(self, timeout: float) -> set[str]:
        """Tables notified within ``timeout``; with ``notify: false`` nothing is
        listened to: sleep, report nothing, and the trackers poll on their backoff."""
        if not self._config.notify:
            if timeout > 0:
                await asyncio.sleep(timeout)
            return set()
        return await self._listener.wait(timeout)

    async def retention(self) -> float | None:
        """The config's ``source.retention``: what the cleanup job passes to
        ``cdc_tracking.cleanup`` (no round trip)."""
        return self._config.retention

    async def cleanup(self, retention: float, scope: CleanupScope | None = None) -> int:
        """Delete tracking entries older than ``retention`` seconds that every reader
        could have read; checkpoints before them expire. With ``scope``, of its
        tables only, and never below another deployment's live claim
        (``pg_retention``)."""
        async with self._sessions.administering("cleanup") as conn:
            return await pg_retention.cleanup(conn, self._schema, retention, scope)

    # -- tracking administration ---------------------------------------------

    async def tracking_enable(self, tables: Sequence[TableConfig]) -> list[str]:
        async with self._sessions.administering("enable change tracking") as conn:
            return await _enable_tracking(conn, self._schema, tables)

    async def check_grantee(self, role: str) -> None:
        async with self._sessions.reading(f"look role {role} up", transaction=False) as conn:
            await pg_grants.check_role(conn, role)

    async def grant_runtime(self, tables: Sequence[TableConfig], role: str) -> list[str]:
        """Grant ``role`` what ``cdc run`` needs on ``tables``, now and for what
        is created later (``pg_grants.grant_runtime``)."""
        async with self._sessions.administering(f"grant the runtime privileges to {role}") as conn:
            return await pg_grants.grant_runtime(conn, self._schema, tables, role)

    async def tracking_disable(self, tables: Sequence[TableConfig]) -> list[str]:
        async with self._sessions.administering("disable change tracking") as conn:
            await pg_tracking.lock_schema(conn, self._schema)
            done = [await pg_tracking.disable_table(conn, self._schema, t.schema, t.name) for t in tables]
            if await pg_tracking.drop_schema_if_unused(conn, self._schema):
                done.append(f"schema {self._schema}: dropped (no table is tracked any more)")
        return done

    async def tracking_status(self, tables: Sequence[TableConfig]) -> list[TrackingStatus]:
        async with self._sessions.reading("read tracking status") as conn:
            version = await pg_reads.read_bound(conn)
            return [await pg_status.table_status(conn, self._schema, t, version) for t in tables]

    async def doctor(self, tables: Sequence[TableConfig]) -> list[Finding]:
        """What the source can see: tracking installed, triggers in place, privileges,
        and transactions old enough to hold every table's changes back."""
        async with self._sessions.reading("doctor") as conn:
            return await pg_doctor.doctor(
                conn, self._schema, tables, cleanup=self._config.cleanup_interval > 0
            )


async def _enable_tracking(conn: Connection, schema: str, tables: Sequence[TableConfig]) -> list[str]:
    """``tracking enable`` in one transaction: every table's ownership checked
    before anything is installed, any refusal rolling back all of it."""
    await pg_tracking.lock_schema(conn, schema)
    refused = await pg_grants.not_owned(conn, tables)
    if refused:  # all of them at once, before anything is installed
        role = await pg_grants.current_role(conn)
        raise SourceError(pg_grants.ownership_error(role, refused))
    await pg_tracking.install_schema(conn, schema)
    done = []
    for table_config in tables:
        found = await pg_catalog.find_table(conn, table_config.schema, table_config.name)
        if found is None:
            renamed = await pg_status.renamed_to(conn, schema, table_config.table)
            raise await pg_catalog.missing_table(conn, table_config.schema, table_config.name, renamed)
        pg_types.check_published(table_config, found)  # raising rolls back all of it
        done.append(await pg_tracking.enable_table(conn, schema, found))
    return done
