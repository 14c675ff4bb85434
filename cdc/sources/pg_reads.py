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
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

import orjson
import psycopg
from psycopg import AsyncCursor, sql

from cdc.errors import SourceUnavailable, TableChanged, TrackingExpired, TrackingNotEnabled
from cdc.sources import pg_tracking
from cdc.sources.base import ChangePage, ChangeRow, Cursor, TableInfo
from cdc.sources.pg_catalog import Connection

if TYPE_CHECKING:  # pg_read_encoded imports pg_snapshot, which imports this module
    from cdc.sources.pg_read_encoded import EncodedRead

# A read tries one statement first (``whole_read``) and takes this many rows
# at most that way; a larger read pays for them twice, so they are few.
WHOLE_READ_ROWS = 500

_names = itertools.count(1)


def source_relation(info: TableInfo, *, ordinary: bool) -> sql.Composable:
    """The table rows are read from: ``ONLY`` the table itself when it is an
    ordinary table, whose change triggers see its own rows alone. Without
    ONLY, a SELECT also reads the rows of tables that inherit from it
    (https://www.postgresql.org/docs/current/ddl-inherit.html), whose writes
    fire their own triggers, not the parent's: a snapshot would mirror them
    and no change would ever follow them. A partitioned table holds no rows
    itself (ONLY would read none); its partitions' writes do fire the triggers
    ``tracking enable`` put on it."""
    table = sql.Identifier(info.schema, info.name)
    return sql.SQL("only {}").format(table) if ordinary else table


def changes_query(
    schema: str,
    net: str,
    info: TableInfo,
    *,
    after: bool,
    limit: bool,
    ordinary: bool,
    bound: sql.Composable | None = None,
    encoded: EncodedRead | None = None,
) -> sql.Composed:
    """Entries in (since, bound], after a (version, key) cursor when ``after``,
    joined to the source row. Parameters: since, bound (unless ``bound`` is
    given as an expression), [cursor...], [limit]. Row layout: version, op,
    creation_version, column_versions, found, the key (from the entry, so
    deletes have it too), the published columns (``encoded``: its select)."""
    keys = sql.SQL(", ").join(sql.Identifier("n", k) for k in info.primary_key)
    on = sql.SQL(" and ").join(
        sql.SQL("{} = {}").format(sql.Identifier("t", k), sql.Identifier("n", k)) for k in info.primary_key
    )
    cursor: sql.Composable = sql.SQL("")
    if after:
        placeholders = sql.SQL(", ").join(sql.Placeholder() * (1 + len(info.primary_key)))
        cursor = sql.SQL(" and (n.version, {}) > ({})").format(keys, placeholders)
    return sql.SQL(
        "select n.version, n.op, n.creation_version, n.column_versions::text, {found} is not null,"
        " {keys}, {columns}"
        " from {net} as n left join {source} as t on {on}"
        " where n.version > %s and n.version <= {bound}{cursor} order by n.version, {keys}{limit}"
    ).format(
        bound=sql.Placeholder() if bound is None else bound,
        found=sql.Identifier("t", info.primary_key[0]),
        keys=keys,
        columns=encoded.select
        if encoded is not None
        else sql.SQL(", ").join(sql.Identifier("t", c) for c in info.column_names),
        net=sql.Identifier(schema, net),
        source=source_relation(info, ordinary=ordinary),
        on=on,
        cursor=cursor,
        limit=sql.SQL(" limit %s") if limit else sql.SQL(""),
    )


def window_query(schema: str, info: TableInfo) -> sql.Composed:
    """This snapshot's bound (xmin - 1) and xmax, the table's registry entry (net
    table, min_valid_version, the table object it was enabled for, what raised
    min_valid_version last: read through to_jsonb, as a registry not migrated
    yet has no table_oid nor expired_by), and the table object the table's name
    stands for now. Parameter: "schema.name". Row layout: ``Window``'s fields."""
    return sql.SQL(
        "select pg_snapshot_xmin(s)::text::bigint - 1 as bound, pg_snapshot_xmax(s)::text::bigint as xmax,"
        " r.net_table, r.min_valid_version, (to_jsonb(r) ->> 'table_oid')::oid as registered_oid,"
        " to_regclass(quote_ident({}) || '.' || quote_ident({}))::oid as current_oid,"
        " to_jsonb(r) ->> 'expired_by' as expired_by"
        " from pg_current_snapshot() as s left join {} as r on r.table_name = %s"
    ).format(sql.Literal(info.schema), sql.Literal(info.name), sql.Identifier(schema, "tracked_tables"))


@dataclass(frozen=True)
class Window:
    """What a read checks before it reads (``window_query``)."""

    bound: int
    xmax: int
    net: str | None
    min_valid: int | None
    registered_oid: int | None
    current_oid: int | None
    expired_by: str | None = None  # what raised min_valid last (pg_retention); None: not recorded


WINDOW_COLUMNS = len(fields(Window))


def whole_read_query(
    schema: str, net: str, info: TableInfo, *, ordinary: bool, encoded: EncodedRead | None = None
) -> sql.Composed:
    """The window and the first ``limit`` entries up to its bound, in ONE
    statement, so in one snapshot without a transaction around it: a read
    that fits one page (every poll of a table that is quiet or keeping up)
    costs one round trip instead of four. Parameters: "schema.name", since,
    limit. Row layout: the window's columns, then ``changes_query``'s
    (all NULL, in the one row, when there is no entry)."""
    changes = changes_query(
        schema,
        net,
        info,
        after=False,
        limit=True,
        ordinary=ordinary,
        bound=sql.SQL("w.bound"),
        encoded=encoded,
    )
    return sql.SQL("select * from ({}) as w left join lateral ({}) as c on true").format(
        window_query(schema, info), changes
    )


class RowReader:
    """A page's rows as net changes, with the table's names looked up once. The
    operation is relative to ``since``: D when the row is gone (or, should a
    change have escaped the triggers, absent), I when created after ``since``,
    else U with the published columns changed after ``since``."""

    def __init__(self, info: TableInfo, since: int) -> None:
        self.since = since
        self.keys = info.primary_key
        self.names = info.column_names
        self.published = frozenset(self.names)
        self.width = len(self.keys)
        # A one-column key (the common case) read as a dict display: 0.07 µs a row against
        # 0.52 for dict(zip(..., strict=True)); any keyword to zip costs 0.2 (timeit, CPython 3.11).
        self.single = self.keys[0] if self.width == 1 else None

    def composite_key(self, record: Sequence[Any], end: int) -> dict[str, Any]:
        return dict(zip(self.keys, record[5:end]))  # noqa: B905

    def __call__(self, record: Sequence[Any]) -> ChangeRow:
        version, op, creation_version, column_versions, found = record[:5]
        end = 5 + self.width
        key = {self.single: record[5]} if self.single is not None else self.composite_key(record, end)
        if not found:
            return ChangeRow("D", version, key, None)
        return self.row(record, version, op, creation_version, column_versions, key)

    def row(
        self,
        record: Sequence[Any],
        version: int,
        op: str,
        created: int,
        column_versions: str | None,
        key: Any,
    ) -> ChangeRow:
        """A row that is there: its values after the key."""
        values = dict(zip(self.names, record[5 + self.width :], strict=True))
        if op == "D":
            # The entry says D yet the row is in the same view: a statement that swapped
            # primary keys under a DEFERRABLE key (row 1 -> 2 records D 1, I 2; row 2 -> 1
            # then records D 2 over that I 2). The row is what the document must hold.
            return ChangeRow("U", version, key, values)
        if created > self.since:
            return ChangeRow("I", version, key, values)
        return ChangeRow("U", version, key, values, functools.partial(self.changed, column_versions))

    def changed(self, column_versions: str | None) -> frozenset[str]:
        """The published columns changed after ``since``, from the entry's
        ``column_versions`` (read as text: parsed only if asked for)."""
        versions: dict[str, int] = orjson.loads(column_versions or "{}")  # column names and xids
        since, published = self.since, self.published
        return frozenset(c for c, v in versions.items() if v > since and c in published)


def change_page(
    info: TableInfo,
    since: int,
    bound: int,
    records: Sequence[Any],
    limit: int,
    encoded: EncodedRead | None = None,
) -> ChangePage:
    """Up to ``limit`` rows; ``records`` holds one more when another page follows."""
    return _page(list(map(_reader(info, since, encoded), records[:limit])), bound, len(records) > limit)


def _reader(info: TableInfo, since: int, encoded: EncodedRead | None) -> RowReader:
    return RowReader(info, since) if encoded is None else encoded.reader(info, since)


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
    cursor: AsyncCursor[Any],
    info: TableInfo,
    since: int,
    bound: int,
    limit: int,
    ahead: list[Any],
    encoded: EncodedRead | None = None,
) -> tuple[ChangePage, list[Any]]:
    """``change_page`` over ``ahead`` and then the cursor's rows (``limit + 1``
    at most, together), loaded and converted in chunks, yielding between
    them; also returns the records beyond ``limit`` (the one fetched ahead)."""
    reader = _reader(info, since, encoded)
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
        self.encoded: EncodedRead | None = None  # the read's layout (``pg_read_encoded``)

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

    def continues(self, conn: Connection | None, since: int, upto: int | None, after: Cursor | None) -> bool:
        return (conn, since, upto, after) == (self.conn, self.since, self.bound, self.after)

    async def next_page(self, info: TableInfo, limit: int) -> ChangePage:
        count = limit + 1 - len(self.pending)
        fetch = sql.SQL("fetch forward {} from {}").format(sql.Literal(count), sql.Identifier(self.name))
        cursor = await self.conn.execute(fetch)
        page, self.pending = await load_page(
            cursor, info, self.since, self.bound, limit, self.pending, self.encoded
        )
        self.after = page.cursor
        return page

    async def close(self) -> None:
        if not (self.conn.closed or self.conn.broken):
            await self.conn.execute(sql.SQL("close {}").format(sql.Identifier(self.name)))


# -- a read's window, and its pages ----------------------------------------------


async def read_bound(conn: Connection) -> int:
    """The version the current snapshot is consistent with: ``xmin - 1``."""
    row = await (
        await conn.execute("select pg_snapshot_xmin(pg_current_snapshot())::text::bigint - 1")
    ).fetchone()
    assert row is not None
    return int(row[0])


def check_window(info: TableInfo, since: int, window: Window) -> None:
    """Raise when the table is not the one ``info`` describes, its changes are not
    captured, or ``since`` is not a valid start for a read of it."""
    check_identity(info, window.current_oid)
    net, min_valid, xmax = window.net, window.min_valid, window.xmax
    if net is None or min_valid is None:
        raise TrackingNotEnabled(
            f"{info.table}: change tracking is not enabled (cdc tracking enable --table {info.table})"
        )
    if window.registered_oid not in (None, window.current_oid):
        raise TrackingNotEnabled(
            f"{info.table}: the table was dropped and created again since change tracking was enabled: "
            f"its changes are not captured; run cdc tracking enable --table {info.table}"
        )
    if since >= xmax:
        reason = f"the source's next transaction id {xmax} is not above the checkpoint {since}: restored?"
        raise TrackingExpired(info.table, reason)
    if since < min_valid:
        cause = window.expired_by or (
            "entries were removed by retention cleanup or a TRUNCATE, or tracking was re-enabled"
        )
        raise TrackingExpired(
            info.table, f"the checkpoint {since} is below the minimum valid version {min_valid}: {cause}"
        )


def check_identity(info: TableInfo, current_oid: int | None) -> None:
    """A table dropped and created again under the name ``info`` was described
    with is another table: its columns may even be the same."""
    if info.identity and current_oid is not None and str(current_oid) != info.identity:
        raise TableChanged(
            f"{info.table}: the table changed while it was read (it was dropped and created again): "
            "describing it again"
        )


async def window(conn: Connection, schema: str, info: TableInfo, since: int) -> tuple[int, str]:
    """This snapshot's bound and the table's net table; raises when ``since`` is not valid."""
    qualified = f"{info.schema}.{info.name}"
    try:
        row = await (await conn.execute(window_query(schema, info), [qualified])).fetchone()
    except psycopg.errors.UndefinedTable:
        raise TrackingNotEnabled(
            f"{info.table}: change tracking is not installed (cdc tracking enable --table {info.table})"
        ) from None
    assert row is not None
    found = Window(*row)
    check_window(info, since, found)
    return int(found.bound), str(found.net)


async def whole_read(
    conn: Connection,
    schema: str,
    info: TableInfo,
    since: int,
    limit: int,
    queries: dict[TableInfo, bytes],
    *,
    ordinary: bool,
    encoded: EncodedRead | None = None,
) -> tuple[ChangePage, bool] | None:
    """A read that fits one page, in one statement (``whole_read_query``, composed
    once per table into ``queries``), and whether its bound covers every
    transaction that had committed (``xmin = xmax``); None when it does not fit
    (or anything is unusual): the caller then reads in a transaction, which
    pages, and which raises the precise errors."""
    qualified = f"{info.schema}.{info.name}"
    net = pg_tracking.net_table_name(info.schema, info.name)
    queries = queries if encoded is None else encoded.queries
    query = queries.get(info)
    if query is None:
        composed = whole_read_query(schema, net, info, ordinary=ordinary, encoded=encoded)
        query = queries[info] = composed.as_bytes(conn)
    probe = min(limit, WHOLE_READ_ROWS)
    try:
        records = await (await conn.execute(query, [qualified, since, probe + 1])).fetchall()
    except psycopg.errors.UndefinedTable:
        return None  # tracking is not installed, or the net table is gone
    found = Window(*records[0][:WINDOW_COLUMNS])
    check_window(info, since, found)
    if found.net != net or len(records) > probe:
        return None
    rows = [record[WINDOW_COLUMNS:] for record in records if record[WINDOW_COLUMNS] is not None]
    page = change_page(info, since, max(since, found.bound), rows, limit, encoded)
    return page, found.bound + 1 >= found.xmax


async def first_page(
    conn: Connection,
    schema: str,
    info: TableInfo,
    since: int,
    limit: int,
    upto: int | None,
    after: Cursor | None,
    *,
    ordinary: bool,
    encoded: EncodedRead | None = None,
) -> tuple[ChangePage, HeldRead | None]:
    """One transaction: check ``since``, fix the bound, read a page and hold the rest."""
    async with conn.transaction():
        await lock_source(conn, info)
        bound, net = await window(conn, schema, info, since)
        bound = max(since, bound if upto is None else min(upto, bound))
        query = changes_query(
            schema, net, info, after=after is not None, limit=True, ordinary=ordinary, encoded=encoded
        )
        cursor = [] if after is None else [after[0], *after[1]]
        result = await conn.execute(query, [since, bound, *cursor, limit + 1])
        page, _ = await load_page(result, info, since, bound, limit, [], encoded)
        if page.cursor is None:
            return page, None
        rest = changes_query(schema, net, info, after=True, limit=False, ordinary=ordinary, encoded=encoded)
        params = [since, bound, page.cursor[0], *page.cursor[1]]
        held = await HeldRead.declare(conn, rest, params, since, bound)
        held.after, held.encoded = page.cursor, encoded
        return page, held


# -- snapshots --------------------------------------------------------------------


async def lock_source(conn: Connection, info: TableInfo) -> None:
    """Take the source table's ACCESS SHARE lock before the transaction's first
    query fixes its snapshot. A table rewrite (ALTER COLUMN ... TYPE, ADD COLUMN
    with a volatile default) is not MVCC-safe: a snapshot taken before it
    commits sees the rewritten table empty, so a read would take every changed
    row for deleted and a snapshot would find no row. Holding the lock first,
    the rewrite waits for the transaction, or the transaction for the rewrite."""
    await conn.execute(
        sql.SQL("lock table {} in access share mode").format(sql.Identifier(info.schema, info.name))
    )


async def snapshot_version(conn: Connection, schema: str, info: TableInfo) -> int:
    """The version the snapshot is consistent with (its first statement fixes
    the snapshot). Below the table's minimum valid version (tracking was just
    enabled, or the table truncated, while an older transaction still runs)
    no read could follow it: that is a wait, not a reason to snapshot again.
    A table dropped and created again since ``info`` was described is refused
    (``check_identity``)."""
    version = await read_bound(conn)
    current = await (
        await conn.execute(
            "select to_regclass(quote_ident(%s) || '.' || quote_ident(%s))::oid", [info.schema, info.name]
        )
    ).fetchone()
    check_identity(info, current[0] if current else None)
    entry = await pg_tracking.registry_entry(conn, schema, f"{info.schema}.{info.name}")
    if entry is not None and version < entry.min_valid_version:
        raise SourceUnavailable(
            f"{info.table}: a snapshot now would be at version {version}, below the minimum valid "
            f"version {entry.min_valid_version}: waiting for older transactions to end"
        )
    return version


async def estimated_rows(conn: Connection, info: TableInfo, *, ordinary: bool) -> int | None:
    """For progress: the planner's estimate, or a count when there is none yet."""
    row = await (
        await conn.execute(
            "select c.reltuples::bigint from pg_class c join pg_namespace n on n.oid = c.relnamespace"
            " where n.nspname = %s and c.relname = %s",
            [info.schema, info.name],
        )
    ).fetchone()
    if row is not None and row[0] >= 0:
        return int(row[0])
    count = sql.SQL("select count(*) from {}").format(source_relation(info, ordinary=ordinary))
    counted = await (await conn.execute(count)).fetchone()
    return int(counted[0]) if counted else None
