"""The T-SQL of a backlog: a read's net changes, evaluated once, paged from tempdb.

A read whose first page is not the whole read (``mssql_reads.first_page``)
reads its other pages from ``#cdc_changes``, a temporary table of the
reader's session that holds what CHANGETABLE returned after the first page:
version, creation version, operation, column mask and key, numbered in
(version, key) order. CHANGETABLE is evaluated once more to fill it, in the
read's SNAPSHOT transaction, and never again however many pages follow: each
page is a seek on the row number and a join to the table by its primary key.
Before, every page ran the whole CHANGETABLE query again (a net-change
aggregate over everything after ``since``, sorted), so a backlog of N changes
cost about N/page evaluations, and after a long outage one page could reach
the query timeout.

Why a temporary table, and not one query whose rows are fetched page by page
(``fetchmany``) from a cursor kept open between the caller's calls: a query
whose client has not fetched its rows yet is still running, and SQL Server
"can't release the locks" it holds while it waits for the client
(ASYNC_NETWORK_IO: "Troubleshoot slow queries that result from
ASYNC_NETWORK_IO wait type", learn.microsoft.com). Under SNAPSHOT that is the
schema stability lock on the table: an ALTER TABLE or index rebuild would wait
for the sidecar's consumer (up to ``mssql_held.HOLD_LIMIT`` per page), and
every query of the application on the table would queue behind it. The sort's
memory grant, too, is the query's until it ends, and the connection (MARS
off) could run nothing else meanwhile. Here no statement is in flight between
pages; the transaction still keeps its snapshot (the version store) until the
last page, as it did before.

What is allowed in the transaction: the DDL statements "not permitted under
snapshot isolation after a BEGIN TRANSACTION statement" are ALTER TABLE,
CREATE INDEX, CREATE XML INDEX, ALTER INDEX, DROP INDEX, DBCC REINDEX, ALTER
PARTITION FUNCTION/SCHEME and CLR DDL (MSSQLSERVER_3961, learn.microsoft.com):
CREATE TABLE is not among them, so the table and its clustered primary key
are one CREATE TABLE inside the transaction. A rollback (an abandoned read,
an error) undoes it with the rest; a committed read drops it after its COMMIT.
Local temporary tables need no snapshot setting of tempdb (only global ones
do: "Using Row Versioning-based Isolation Levels", learn.microsoft.com).
Nothing here has run on a SQL Server yet: tests/cdc/sources/test_mssql_backlog_live.py
settles it where one is reachable.

The backlog's own columns start with ``@``, which no primary-key column may
(``mssql_catalog.choose_columns`` refuses it), so they never clash with the
key columns, which keep their names, types and collations.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cdc.sources.mssql_sql import (
    Statement,
    TableShape,
    change_columns,
    changes_after,
    collation,
    quote,
    sql_type,
)

TABLE = "#cdc_changes"
# CHANGETABLE's types for these columns (CHANGETABLE (Transact-SQL), learn.microsoft.com)
_CHANGE_COLUMNS = (
    ("[@v]", "bigint NOT NULL"),  # SYS_CHANGE_VERSION
    ("[@cv]", "bigint NULL"),  # SYS_CHANGE_CREATION_VERSION
    ("[@op]", "nchar(1) NOT NULL"),  # SYS_CHANGE_OPERATION
    ("[@cols]", "varbinary(4100) NULL"),  # SYS_CHANGE_COLUMNS
)
_FROM_CHANGETABLE = (
    "ct.SYS_CHANGE_VERSION",
    "ct.SYS_CHANGE_CREATION_VERSION",
    "ct.SYS_CHANGE_OPERATION",
    "ct.SYS_CHANGE_COLUMNS",
)
DROP = Statement(f"DROP TABLE IF EXISTS {TABLE}")


def create(shape: TableShape) -> Statement:
    """The backlog table: row number (the clustered key pages seek on), the
    SYS_CHANGE_* columns, and the primary key in its own types."""
    # PRIMARY KEY "defaults to CLUSTERED" (CREATE TABLE (Transact-SQL), learn.microsoft.com); no
    # constraint name: a temporary table's constraint names share tempdb's namespace, so one
    # name would clash between the readers' sessions
    columns = ["[@rn] bigint NOT NULL PRIMARY KEY"]
    columns += [f"{name} {spelled}" for name, spelled in _CHANGE_COLUMNS]
    columns += [
        f"{quote(c)} {_key_type(t, k)} NOT NULL"
        for c, t, k in zip(shape.primary_key, shape.key_types, _collations(shape), strict=True)
    ]
    return Statement(f"CREATE TABLE {TABLE} ({', '.join(columns)})")


def fill(shape: TableShape, *, since: int, upto: int, after: tuple[int, Sequence[Any]] | None) -> Statement:
    """CHANGETABLE's rows after ``since`` up to ``upto`` and after the ``after``
    cursor, numbered in (version, key) order: the one evaluation of the read
    after its first page."""
    key = [quote(c) for c in shape.primary_key]
    order = ", ".join(["ct.SYS_CHANGE_VERSION", *(f"ct.{k}" for k in key)])
    target = ", ".join(["[@rn]", *(name for name, _ in _CHANGE_COLUMNS), *key])
    select = ", ".join(
        [f"ROW_NUMBER() OVER (ORDER BY {order})", *_FROM_CHANGETABLE, *(f"ct.{k}" for k in key)]
    )
    where, params = changes_after(shape, upto=upto, after=after)
    sql = (
        f"INSERT INTO {TABLE} ({target}) SELECT {select} "  # noqa: S608 - identifiers quoted, values are parameters
        f"FROM CHANGETABLE(CHANGES {shape.qualified}, ?) AS ct WHERE {where}"
    )
    return Statement(sql, (since, *params))


def page(shape: TableShape, *, limit: int, after_row: int, column_ids: Sequence[int | None]) -> Statement:
    """A page of the backlog, the rows numbered after ``after_row``: the columns
    of ``mssql_sql.changes`` (the row's values read now, in the read's
    snapshot), then the row number."""
    select, params = change_columns("p", shape, [f"p.{name}" for name, _ in _CHANGE_COLUMNS], column_ids)
    join = " AND ".join(f"t.{quote(c)} = p.{quote(c)}" for c in shape.primary_key)
    sql = (
        f"SELECT TOP (?) {', '.join(select)}, p.[@rn] "  # noqa: S608
        f"FROM {TABLE} AS p LEFT JOIN {shape.qualified} AS t ON {join} "
        "WHERE p.[@rn] > ? ORDER BY p.[@rn]"
    )
    return Statement(sql, (limit, *params, after_row))


def _collations(shape: TableShape) -> tuple[str | None, ...]:
    return shape.key_collations or (None,) * len(shape.primary_key)


def _key_type(declared: str, key_collation: str | None) -> str:
    """A key column's type in the backlog: its own (a rowversion key as the
    binary(8) it is: a timestamp column cannot be inserted into), in its own
    collation, so that the join to the table compares as the key does."""
    if declared.lower() in ("timestamp", "rowversion"):
        return "binary(8)"
    spelled = sql_type(declared)
    return f"{spelled} COLLATE {collation(key_collation)}" if key_collation else spelled
