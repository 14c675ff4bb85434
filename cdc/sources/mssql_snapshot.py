"""The snapshot of a SQL Server table: keyset pages in chunks, resumable.

The version comes first: ``CHANGE_TRACKING_CURRENT_VERSION()`` is read in the
snapshot's first SNAPSHOT transaction, before any row, and every page is
yielded at it. Then the table is read in primary-key keyset pages, in
*chunks*: one SNAPSHOT transaction holds pages until it has been open
``CHUNK_SECONDS``, then commits, and the next page opens the next one. A chunk
that fails for a transient reason (3961: DDL or index maintenance on the table
committed after the chunk began, "MSSQLSERVER_3961", learn.microsoft.com; a
lost connection; a timeout) is not the snapshot's end: the next chunk
continues after the last key read, up to ``RESUMES`` times in a row without a
page read in between. Before, one transaction held the whole table: any DDL or
index rebuild on it during the snapshot (3961) threw away everything read,
and the snapshot started again from scratch; and the transaction kept the
version store of the whole instance's tempdb for as long as the snapshot ran.

What that gives up, and why it is still right: rows of a later chunk are read
after the version, so a page may hold a row as it is after the version
(changed, inserted) and may lack one deleted after it. The tracker then
catches up from the version (``cdc.snapshots``, then the tracker's reads),
and net changes after it carry, for every key changed after it, its current
row or a D (CHANGETABLE (Transact-SQL), learn.microsoft.com: one row per
changed key with its last operation relative to the version): whatever a
later chunk saw early is read again at a version above the snapshot's, which
the apply rule lets through, and a row the snapshot missed because it was
deleted is deleted by the snapshot's sweep and by its D. A snapshot read within
one chunk (most: 30 s) is one consistent view, as before.

The catch-up is possible only while the version is still valid: each chunk
checks, in its own transaction, that the table is the one described and that
its minimum valid version is still at or below the version, and it is checked
again after the last COMMIT (else ``TrackingExpired``: cleanup ran past it,
or the table was truncated, during the snapshot).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from cdc.errors import SourceUnavailable, TrackingExpired, TrackingNotEnabled
from cdc.sources import mssql_sql as sql
from cdc.sources import mssql_sql_catalog as catalog_sql
from cdc.sources.base import SnapshotPage, TableInfo
from cdc.sources.mssql_catalog import DescribedTable
from cdc.sources.mssql_link import Link, execute, fetch_all, fetch_one, fetch_scalar
from cdc.sources.mssql_reads import (
    check_identity,
    check_snapshot_versions,
    min_valid_is_null,
    snapshot_cursor,
    snapshot_row,
)

log = logging.getLogger("cdc.sources.mssql")

# Seconds a chunk's SNAPSHOT transaction may stay open before it commits at the
# next page: what an open snapshot transaction keeps in tempdb's version store
# grows with the time it stays open ("Row versioning-based isolation levels",
# learn.microsoft.com), and so does the chance that DDL hits it.
CHUNK_SECONDS = 30.0
# Chunks that may fail in a row (with no page read in between) before the snapshot gives up
RESUMES = 3

CheckRows = Callable[[Sequence[dict[str, Any] | None]], Awaitable[None]]


async def read_snapshot(
    link: Link,
    described: DescribedTable,
    page_size: int,
    check_rows: CheckRows,
    *,
    after: Sequence[Any] | None = None,
    start: Sequence[Any] | None = None,
    until: Sequence[Any] | None = None,
) -> AsyncIterator[SnapshotPage]:
    """The table's pages (the module docstring), on ``link``, a connection of
    the snapshot's own: the keys above ``after`` (a stopped snapshot going on),
    within ``start``..``until`` (both inclusive: a key range). ``check_rows`` raises for rows a converter could not
    read when the table changed shape. An empty table gives one empty page,
    so the version is always known."""
    if page_size < 1:
        raise ValueError("page_size must be at least 1")
    info = described.info
    version, total = await link.run(lambda conn: snapshot_begin(conn, info), info.table)
    chunk = _Chunk(opened=time.monotonic())
    # a resumed snapshot starts after the key it stopped at: the same keyset
    # predicate as the chunks' (mssql_sql.snapshot_page), in key order
    cursor: list[Any] | None = None if after is None else list(after)
    first = True
    while True:
        bounds = Bounds(cursor, start if cursor is None else None, until)
        raw = await chunk.page(link, described, version, page_size, bounds)
        if raw is None:
            continue  # the chunk failed: a new one continues after the last key
        rows = [snapshot_row(described, r) for r in raw]
        await check_rows(rows)
        last = snapshot_cursor(described.shape, raw[-1]) if raw else None
        if rows or first:
            yield SnapshotPage(version=version, rows=rows, total=total, last_key=last)
        first = False
        if last is None or len(raw) < page_size:
            break
        cursor = list(last)
        await chunk.end_if_due(link, info)
    await link.run(lambda conn: snapshot_end(conn, info, version), info.table)


@dataclass(frozen=True)
class Bounds:
    """A page's keys: above ``after`` (the last key read), or at or above
    ``start`` (a range's first page), and at or below ``until``."""

    after: Sequence[Any] | None
    start: Sequence[Any] | None
    until: Sequence[Any] | None


class _Chunk:
    """The snapshot's current SNAPSHOT transaction, and the failures in a row."""

    def __init__(self, opened: float) -> None:
        self.open = True
        self.opened = opened
        self.failures = 0

    async def page(
        self, link: Link, described: DescribedTable, version: int, page_size: int, bounds: Bounds
    ) -> list[Any] | None:
        """The page within ``bounds`` in this chunk (a new one begun if none is
        open); None when the chunk failed for a transient reason and the
        snapshot goes on in a new one."""
        info = described.info
        statement = sql.snapshot_page(
            described.shape, limit=page_size, after=bounds.after, start=bounds.start, until=bounds.until
        )
        try:
            if not self.open:
                await link.run(lambda conn: chunk_begin(conn, info, version), info.table)
                self.open, self.opened = True, time.monotonic()
            raw: list[Any] = await link.run(lambda conn: fetch_all(conn, statement), info.table)
        except SourceUnavailable as exc:
            # The link dropped its connection (mssql_link.Link): the transaction is gone.
            self.open = False
            self.failures += 1
            if self.failures > RESUMES:
                raise
            log.warning(
                "snapshot chunk failed: continuing after the last key read, in a new transaction",
                extra={"table": info.table, "reason": str(exc), "attempt": self.failures},
            )
            return None
        self.failures = 0
        return raw

    async def end_if_due(self, link: Link, info: TableInfo) -> None:
        if self.open and time.monotonic() - self.opened >= CHUNK_SECONDS:
            await link.run(lambda conn: execute(conn, sql.COMMIT), info.table)
            self.open = False


def snapshot_begin(conn: Any, info: TableInfo) -> tuple[int, int | None]:
    """Open the snapshot's first transaction: the current version first, before
    any table is read, so the table's rows include everything up to it."""
    execute(conn, sql.SET_READ_COMMITTED)
    estimate = fetch_scalar(conn, catalog_sql.row_estimate(info.schema, info.name))
    current, min_valid = begin_at_current_version(conn, info)
    check_snapshot_versions(info.table, min_valid, current)
    return current, None if estimate is None else int(estimate)


def begin_at_current_version(conn: Any, info: TableInfo) -> tuple[int, int]:
    """Open a SNAPSHOT transaction and read, first, the current version and the
    table's minimum valid version (its identity checked): what is read in it
    next includes everything up to that version. (current, min_valid)."""
    execute(conn, sql.SET_SNAPSHOT)
    execute(conn, sql.BEGIN)
    current = fetch_scalar(conn, sql.CURRENT_VERSION)
    if current is None:
        raise TrackingNotEnabled(
            f"{info.table}: CHANGE_TRACKING_CURRENT_VERSION() is NULL: change tracking is off"
        )
    min_valid, object_id = fetch_one(conn, sql.min_valid_version(info.schema, info.name))
    check_identity(info, object_id)
    if min_valid is None:
        raise TrackingNotEnabled(min_valid_is_null(info.table))
    return int(current), int(min_valid)


def chunk_begin(conn: Any, info: TableInfo, version: int) -> None:
    """Open a later chunk's transaction (SET again: the connection may be a new one)."""
    execute(conn, sql.SET_SNAPSHOT)
    execute(conn, sql.BEGIN)
    min_valid, object_id = fetch_one(conn, sql.min_valid_version(info.schema, info.name))
    check_still_valid(info, version, min_valid, object_id)


def snapshot_end(conn: Any, info: TableInfo, version: int) -> None:
    """Commit the last chunk, then check that the version is still valid now
    that every row is read. After the COMMIT, not before: no page says whether
    the minimum valid version read inside a SNAPSHOT transaction follows a
    cleanup that ran after the transaction began (the documented pattern
    relies on the transaction's reads being unaffected by it); read on its
    own, it is the one the catch-up will be checked against."""
    execute(conn, sql.COMMIT)
    min_valid, object_id = fetch_one(conn, sql.min_valid_version(info.schema, info.name))
    check_still_valid(info, version, min_valid, object_id)


def check_still_valid(info: TableInfo, version: int, min_valid: Any, object_id: Any) -> None:
    """The table is the one described, tracked, and changes after ``version``
    can still be read (the catch-up after the snapshot starts there)."""
    check_identity(info, object_id)
    if min_valid is None:
        raise TrackingNotEnabled(min_valid_is_null(info.table))
    if int(min_valid) > version:
        raise TrackingExpired(
            info.table,
            f"the minimum valid version rose to {min_valid} while the table was snapshotted at {version} "
            "(cleanup ran past it, or the table was truncated): the changes made during the snapshot "
            "cannot be read; it is snapshotted again",
        )
