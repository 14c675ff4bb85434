"""The pages of one read of changes, as units of work on a reader's connection.

A read is one SNAPSHOT transaction (``mssql_reads``' docstring has the
guarantees). Its first page reads CHANGETABLE directly, ``TOP (limit + 1)``:
most reads are that one page (an idle or a quiet table), and commit at once,
having created nothing. When more follows, the transaction stays open
(``HeldRead``) and the next page first fills the read's backlog, the rest of
CHANGETABLE after the first page numbered in tempdb, in the same transaction
(``mssql_backlog_sql`` says why a backlog and not a cursor kept open); every
later page reads the backlog by row number. A read of any length thus
evaluates CHANGETABLE at most twice, where it used to evaluate it once per
page.

The column ids that decode ``SYS_CHANGE_COLUMNS`` are read once per read, in
its transaction (``mssql_sql.column_ids_of``), and kept with the held read
for its later pages.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cdc.errors import SchemaError, SourceUnavailable
from cdc.sources import mssql_backlog_sql as backlog
from cdc.sources import mssql_sql as sql
from cdc.sources.base import Cursor
from cdc.sources.mssql_catalog import DescribedTable
from cdc.sources.mssql_held import HeldRead
from cdc.sources.mssql_link import execute, fetch_all, fetch_one, fetch_scalar, rollback_quietly
from cdc.sources.mssql_reads import check_identity, check_versions


@dataclass(frozen=True)
class PageRead:
    """What a page's unit of work read: at most ``limit + 1`` rows in the
    layout of ``mssql_sql.changes`` (one more than the page: another follows),
    the read's bound, the connection holding its transaction, its mask column
    ids, and where the next page starts in the backlog (None: not filled yet)."""

    rows: list[Any]
    bound: int
    conn: Any
    column_ids: tuple[int | None, ...]
    backlog_row: int | None = None


def first_page(
    described: DescribedTable, since: int, limit: int, upto: int | None, after: Cursor | None
) -> Callable[[Any], PageRead]:
    """The first page of a read, as a unit of work: open the read's SNAPSHOT
    transaction, check the versions, look the mask columns' ids up, read a
    page; commit at once when it is the whole read, else leave the
    transaction open."""
    info = described.info
    cursor = None if after is None else (after[0], list(after[1]))

    def first(conn: Any) -> PageRead:
        execute(conn, sql.SET_SNAPSHOT)
        execute(conn, sql.BEGIN)
        try:
            min_valid, object_id = fetch_one(conn, sql.min_valid_version(info.schema, info.name))
            check_identity(info, object_id)
            current = fetch_scalar(conn, sql.CURRENT_VERSION)
            bound = check_versions(info.table, since, min_valid, current, upto)
            ids = column_ids(conn, described)
            statement = sql.changes(
                described.shape, since=since, upto=bound, limit=limit + 1, after=cursor, column_ids=ids
            )
            rows = page_rows(conn, statement, limit, backlog_filled=False)
        except BaseException:
            rollback_quietly(conn)
            raise
        return PageRead(rows, bound, conn, ids)

    return first


def next_page(held: HeldRead, described: DescribedTable, limit: int) -> Callable[[Any], PageRead]:
    """The next page in the held transaction, as a unit of work: the backlog
    filled first if this is the read's second page; committed (and the
    backlog dropped) when it is the last."""
    shape = described.shape

    def following(conn: Any) -> PageRead:
        if conn is not held.conn:
            # the connection was replaced: its transaction is gone, and with it the snapshot
            raise SourceUnavailable(
                f"{described.info.table}: the connection of a paged read was lost; read again"
            )
        try:
            start = held.backlog_row
            if start is None:
                fill_backlog(conn, shape, held)
                start = 0
            statement = backlog.page(shape, limit=limit + 1, after_row=start, column_ids=held.column_ids)
            numbered = page_rows(conn, statement, limit, backlog_filled=True)
        except BaseException:
            rollback_quietly(conn)  # (undoes the backlog's CREATE TABLE too)
            raise
        rows = [row[:-1] for row in numbered]  # the row number comes last
        last = numbered[limit - 1][-1] if len(numbered) > limit else None
        return PageRead(rows, held.bound, conn, held.column_ids, last)

    return following


def fill_backlog(conn: Any, shape: sql.TableShape, held: HeldRead) -> None:
    """The rest of the read after its first page, into the backlog: CHANGETABLE's
    last evaluation in this read."""
    execute(conn, backlog.create(shape))
    after = (held.after[0], list(held.after[1]))
    execute(conn, backlog.fill(shape, since=held.since, upto=held.bound, after=after))


def page_rows(conn: Any, statement: sql.Statement, limit: int, *, backlog_filled: bool) -> list[Any]:
    """A page of changes, ``statement`` asking for one row more than ``limit``
    to learn whether another page follows; when none does, the read's
    transaction is committed here, in the same unit of work, and its backlog
    dropped after the COMMIT (a temporary table lives as long as the session
    otherwise, and this reader serves other reads)."""
    rows = fetch_all(conn, statement)
    if len(rows) <= limit:
        execute(conn, sql.COMMIT)
        if backlog_filled:
            execute(conn, backlog.DROP)
    return rows


def column_ids(conn: Any, described: DescribedTable) -> tuple[int | None, ...]:
    """The ids of the mask columns now, by name, in the read's transaction;
    SchemaError when one is gone (dropped or renamed since the describe)."""
    shape = described.shape
    if not shape.mask_columns:
        return ()
    by_name = {str(name): int(column_id) for name, column_id in fetch_all(conn, sql.column_ids_of(shape))}
    gone = [c for c in shape.mask_columns if c not in by_name]
    if gone:
        raise SchemaError(
            f"{described.info.table}: column {gone[0]} is gone (dropped or renamed) since the table was "
            "described: it will be described again"
        )
    return tuple(by_name[c] for c in shape.mask_columns)
