"""Net-change and snapshot queries, and the rows they turn into.

A read of changes selects the tracked entries in ``(since, bound]`` joined to
the source table, in ``(version, primary key)`` order. A read that fits one
page is one statement (``whole_read_query``): the window and the rows in one
snapshot, no transaction, one round trip. When more rows qualify
than one page holds, the rest must still come from the *same* snapshot: read
in a later transaction, a row whose entry moved above the bound in between
would be left to the next read, which classifies it relative to the bound
(``U``, with only the columns changed after it), although the caller never
received its earlier change (say, its insert). So the first page's
transaction also declares a ``WITH HOLD`` cursor over the rest of the read;
PostgreSQL materializes it at commit, and later pages are fetched from it
without holding a transaction open between the caller's calls.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
from collections.abc import Sequence
from typing import Any

import orjson
from psycopg import AsyncCursor, sql

from cdc.sources.base import ChangePage, ChangeRow, Cursor, TableInfo
from cdc.sources.pg_catalog import Connection

_names = itertools.count(1)


def changes_query(
    schema: str,
    net: str,
    table: TableInfo,
    *,
    after: bool,
    limit: bool,
    bound: sql.Composable | None = None,
) -> sql.Composed:
    """Entries in (since, bound], after a (version, key) cursor when ``after``,
    joined to the source row. Parameters: since, bound (unless ``bound`` is
    given as an expression), [cursor...], [limit]. Row layout: version, op,
    creation_version, column_versions, found, the key (from the entry, so
    deletes have it too), the published columns."""
    keys = sql.SQL(", ").join(sql.Identifier("n", k) for k in table.primary_key)
    on = sql.SQL(" and ").join(
        sql.SQL("{} = {}").format(sql.Identifier("t", k), sql.Identifier("n", k)) for k in table.primary_key
    )
    cursor: sql.Composable = sql.SQL("")
    if after:
        placeholders = sql.SQL(", ").join(sql.Placeholder() * (1 + len(table.primary_key)))
        cursor = sql.SQL(" and (n.version, {}) > ({})").format(keys, placeholders)
    return sql.SQL(
        "select n.version, n.op, n.creation_version, n.column_versions::text, {found} is not null,"
        " {keys}, {columns}"
        " from {net} as n left join {source} as t on {on}"
        " where n.version > %s and n.version <= {bound}{cursor} order by n.version, {keys}{limit}"
    ).format(
        bound=sql.Placeholder() if bound is None else bound,
        found=sql.Identifier("t", table.primary_key[0]),
        keys=keys,
        columns=sql.SQL(", ").join(sql.Identifier("t", c) for c in table.column_names),
        net=sql.Identifier(schema, net),
        source=sql.Identifier(table.schema, table.name),
        on=on,
        cursor=cursor,
        limit=sql.SQL(" limit %s") if limit else sql.SQL(""),
    )


def window_query(schema: str) -> sql.Composed:
    """This snapshot's bound (xmin - 1) and xmax, and the table's registry entry
    (net table, min_valid_version). Parameter: "schema.name"."""
    return sql.SQL(
        "select pg_snapshot_xmin(s)::text::bigint - 1 as bound, pg_snapshot_xmax(s)::text::bigint as xmax,"
        " r.net_table, r.min_valid_version"
        " from pg_current_snapshot() as s left join {} as r on r.table_name = %s"
    ).format(sql.Identifier(schema, "tracked_tables"))


def whole_read_query(schema: str, net: str, table: TableInfo) -> sql.Composed:
    """The window and the first ``limit`` entries up to its bound, in ONE
    statement, so in one snapshot without a transaction around it: a read
    that fits one page (every poll of a table that is quiet or keeping up)
    costs one round trip instead of four. Parameters: "schema.name", since,
    limit. Row layout: the window's four columns, then ``changes_query``'s
    (all NULL, in the one row, when there is no entry)."""
    changes = changes_query(schema, net, table, after=False, limit=True, bound=sql.SQL("w.bound"))
    return sql.SQL("select * from ({}) as w left join lateral ({}) as c on true").format(
        window_query(schema), changes
    )


def change_row(table: TableInfo, since: int, record: Sequence[Any]) -> ChangeRow:
    """The operation relative to ``since``: D when the row is gone (or, should a
    change have escaped the triggers, absent), I when created after ``since``,
    else U with the published columns changed after ``since``."""
    return _RowReader(table, since)(record)


class _RowReader:
    """``change_row`` for every row of a page, with the table's names looked up once."""

    def __init__(self, table: TableInfo, since: int) -> None:
        self.since = since
        self.keys = table.primary_key
        self.names = table.column_names
        self.published = frozenset(self.names)
        self.width = len(self.keys)

    def __call__(self, record: Sequence[Any]) -> ChangeRow:
        version, op, creation_version, column_versions, found = record[:5]
        end = 5 + self.width
        key = dict(zip(self.keys, record[5:end], strict=True))
        if op == "D" or not found:
            return ChangeRow("D", version, key, None)
        values = dict(zip(self.names, record[end:], strict=True))
        if creation_version > self.since:
            return ChangeRow("I", version, key, values)
        return ChangeRow("U", version, key, values, functools.partial(self.changed, column_versions))

    def changed(self, column_versions: str | None) -> frozenset[str]:
        """The published columns changed after ``since``, from the entry's
        ``column_versions`` (read as text: parsed only if asked for)."""
        versions: dict[str, int] = orjson.loads(column_versions or "{}")  # column names and xids
        since, published = self.since, self.published
        return frozenset(c for c, v in versions.items() if v > since and c in published)


def change_page(table: TableInfo, since: int, bound: int, records: Sequence[Any], limit: int) -> ChangePage:
    """Up to ``limit`` rows; ``records`` holds one more when another page follows."""
    return _page(list(map(_RowReader(table, since), records[:limit])), bound, len(records) > limit)


def _page(rows: list[ChangeRow], bound: int, more: bool) -> ChangePage:
    if not more:
        return ChangePage(rows, bound)
    last = rows[-1]
    return ChangePage(rows, bound, more=True, cursor=(last.version, tuple(last.key.values())))


# Rows loaded and converted between two yields to the event loop. Loading a
# page of 5,000 rows at once holds the loop for ~100 ms, during which the
# batch applier cannot send the next batch to Redis, which then sits idle.
CHUNK = 500


async def fetch_all(cursor: AsyncCursor[Any]) -> list[Any]:
    """``cursor.fetchall()`` in chunks, yielding to the event loop between them."""
    records: list[Any] = []
    while chunk := await cursor.fetchmany(CHUNK):
        records += chunk
        if len(chunk) < CHUNK:
            break
        await asyncio.sleep(0)
    return records


async def load_page(
    cursor: AsyncCursor[Any], table: TableInfo, since: int, bound: int, limit: int, ahead: list[Any]
) -> tuple[ChangePage, list[Any]]:
    """``change_page`` over ``ahead`` and then the cursor's rows (``limit + 1``
    at most, together), loaded and converted in chunks, yielding between
    them; also returns the records beyond ``limit`` (the one fetched ahead)."""
    reader = _RowReader(table, since)
    records = list(ahead)
    rows = list(map(reader, records[:limit]))
    while len(records) <= limit and (chunk := await cursor.fetchmany(CHUNK)):
        room = limit - len(records)
        records += chunk
        rows += map(reader, chunk[: max(0, room)])
        await asyncio.sleep(0)
    return _page(rows, bound, len(records) > limit), records[limit:]


class HeldRead:
    """The rest of a paged read, in a WITH HOLD cursor on the reader's session.

    It continues only the read it belongs to (same connection, since, bound
    and the cursor of the page last returned); anything else starts afresh."""

    def __init__(self, conn: Connection, name: str, since: int, bound: int) -> None:
        self.conn, self.name, self.since, self.bound = conn, name, since, bound
        self.after: Cursor | None = None
        self.pending: list[Any] = []  # the row fetched ahead to learn whether more follow

    @classmethod
    async def declare(
        cls, conn: Connection, query: sql.Composed, params: Sequence[Any], since: int, bound: int
    ) -> HeldRead:
        """Declare inside the read's transaction: the cursor sees its snapshot."""
        held = cls(conn, f"cdc_read_{next(_names)}", since, bound)
        declare = sql.SQL("declare {} no scroll cursor with hold for {}").format(
            sql.Identifier(held.name), query
        )
        await conn.execute(declare, params)
        return held

    def continues(self, conn: Connection, since: int, upto: int | None, after: Cursor | None) -> bool:
        return (conn, since, upto, after) == (self.conn, self.since, self.bound, self.after)

    async def next_page(self, table: TableInfo, limit: int) -> ChangePage:
        count = limit + 1 - len(self.pending)
        fetch = sql.SQL("fetch forward {} from {}").format(sql.Literal(count), sql.Identifier(self.name))
        cursor = await self.conn.execute(fetch)
        page, self.pending = await load_page(cursor, table, self.since, self.bound, limit, self.pending)
        self.after = page.cursor
        return page

    async def close(self) -> None:
        if not (self.conn.closed or self.conn.broken):
            await self.conn.execute(sql.SQL("close {}").format(sql.Identifier(self.name)))


def snapshot_query(table: TableInfo, *, after: bool) -> sql.Composed:
    """A keyset page: parameters [last key...], limit."""
    keys = sql.SQL(", ").join(map(sql.Identifier, table.primary_key))
    cursor: sql.Composable = sql.SQL("")
    if after:
        placeholders = sql.SQL(", ").join(sql.Placeholder() * len(table.primary_key))
        cursor = sql.SQL(" where ({}) > ({})").format(keys, placeholders)
    return sql.SQL("select {} from {}{} order by {} limit %s").format(
        sql.SQL(", ").join(map(sql.Identifier, table.column_names)),
        sql.Identifier(table.schema, table.name),
        cursor,
        keys,
    )
