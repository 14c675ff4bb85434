"""The PostgreSQL source in logical-decoding mode (``source.capture: logical``).

No trigger, no tracking schema: each table's changes are decoded from the WAL
by its own logical replication slot (``pg_logical``), polled with
``pg_logical_slot_peek_binary_changes`` (psycopg 3 has no streaming
replication protocol) and parsed here (``pg_pgoutput``).

A read from ``since``:

1. reads the WAL flush and insert positions and the slot's state
   (``pg_logical.window``): a missing, invalidated or advanced-past slot is
   ``TrackingExpired``, a missing publication ``TrackingNotEnabled``;
2. advances the slot to the table's stored checkpoint (``checkpoint_stored``,
   told by the tracker once Redis holds it), never past ``since``: a slot
   holds WAL, and every peek decodes from it, so it follows the checkpoint,
   but a crash before the next checkpoint replays from the stored one;
3. peeks the transactions that commit below the flush position (at most
   ``DECODE_CHANGES`` changes, whole transactions: the bound is then the last
   one's commit), keeps those whose commit starts above ``since``, and folds
   them into one net change per key (``pg_pgoutput.NetChanges``), valued
   with the decoded tuples: the committed values of that version.

``next_version`` is ``flush - 1`` (or the last commit taken): every commit
starting at or below it was decoded, and no commit can start there later.
A TRUNCATE of the table in the read raises ``TrackingExpired``.

Unchanged TOASTed values (pgoutput's ``u``: an UPDATE that left a large
value alone does not log it) are taken from the same read's earlier change
of the row when there is one, else read from the table by key: the row as
it is now, which a later change (read next) may have moved past the
version; a row gone from the table by then is left out of this read (its
delete follows in a later one). Never written as null.

Changed columns are unknown (None): with the default replica identity the
WAL holds no old values (REPLICA IDENTITY FULL would, at twice the WAL per
UPDATE; nothing downstream needs them).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from cdc.config import SourceConfig, TableConfig
from cdc.errors import TrackingExpired
from cdc.sources import (
    pg_keyed,
    pg_logical,
    pg_logical_admin,
    pg_logical_views,
    pg_reads,
    pg_shape,
    pg_snapshot,
)
from cdc.sources.base import (
    ChangePage,
    ChangeRow,
    CleanupScope,
    Cursor,
    Finding,
    KeyedRows,
    SnapshotPage,
    TableInfo,
    TrackingStatus,
)
from cdc.sources.pg_catalog import Connection
from cdc.sources.pg_logical_values import TupleLoaders
from cdc.sources.pg_pgoutput import UNCHANGED, NetChanges, Relation, Transaction, foreign_keys, transactions
from cdc.sources.postgres import PostgresSource

# Changes one peek decodes at most (pgoutput rows: Begin and Commit count):
# a backlog is read in slices of whole transactions, each held in memory.
DECODE_CHANGES = 20_000


# Per table: whether its publication holds it (a re-created table is in none).
_PUBLISHED = """
select exists (select from pg_publication_tables p where p.pubname = n.name
                and p.schemaname = n.schema_name and p.tablename = n.table_name)
  from unnest(%s::text[], %s::text[], %s::text[]) with ordinality as n(name, schema_name, table_name, ord)
 order by n.ord
"""


@dataclass
class _Held:
    """The rest of a read (``read_changes`` pages from memory)."""

    since: int
    bound: int
    rows: list[ChangeRow]
    after: Cursor | None


def _order(version: int, key: tuple[Any, ...]) -> tuple[Any, ...]:
    """A read's order: version, then the key's values, each with its type's name
    first (a timestamp key holds datetimes and, for infinity, text)."""
    return (version, *((type(v).__name__, v) for v in key))


class PostgresLogicalSource(PostgresSource):
    """``ChangeSource`` for PostgreSQL through logical decoding; see the module docstring."""

    def __init__(self, config: SourceConfig) -> None:
        super().__init__(config)
        self._deployment = config.deployment
        self._stored: dict[str, int] = {}  # table -> the checkpoint Redis holds (checkpoint_stored)
        self._rest: dict[str, _Held] = {}
        self._loaders = TupleLoaders()
        self._fingerprints = self._published_fingerprints
        self.retained_wal: dict[str, int] = {}  # table -> bytes its slot kept at its latest read
        self.decoded = 0  # pgoutput messages decoded, for the benchmark's notes

    def slot(self, table: str, database: str) -> str:
        return pg_logical.slot_name(self._deployment, database, table)

    # -- the tracker tells what Redis holds ----------------------------------------

    def checkpoint_stored(self, table: str, version: int) -> None:
        """The table's checkpoint as Redis now holds it: the slot may move up to it."""
        if version > self._stored.get(table, -1):
            self._stored[table] = version

    # -- shape ----------------------------------------------------------------------

    async def _published_fingerprints(
        self, conn: Connection, tables: Sequence[TableConfig]
    ) -> list[str | None]:
        """The shape (``pg_shape``, a partitioned table's partitions with it)
        and whether the table's publication holds it."""
        found = await pg_shape.fingerprints(conn, self._schema, tables)
        names = [self.slot(t.table, conn.info.dbname) for t in tables]
        published = await (
            await conn.execute(_PUBLISHED, [names, [t.schema for t in tables], [t.name for t in tables]])
        ).fetchall()
        return [
            None if f is None else f"{f} | publication {p[0]}" for f, p in zip(found, published, strict=True)
        ]

    async def current_version(self) -> int:
        async with self._sessions.reading("read the current version", transaction=False) as conn:
            row = await (await conn.execute("select (pg_current_wal_flush_lsn() - '0/0')::bigint")).fetchone()
        assert row is not None
        return int(row[0]) - 1

    def quiet_for(self, info: TableInfo, since: int) -> float:
        return 0.0  # no notification: every poll is a read

    async def wait_for_changes(self, timeout: float) -> set[str]:
        if timeout > 0:
            await asyncio.sleep(timeout)
        return set()

    # -- changes --------------------------------------------------------------------

    async def read_changes(
        self,
        info: TableInfo,
        since: int,
        *,
        limit: int,
        upto: int | None = None,
        after: Cursor | None = None,
    ) -> ChangePage:
        """Net changes after ``since`` (the module docstring), in (version, key)
        order, ``limit`` rows a page; later pages from memory, or, should that be
        gone (another source), decoded again up to ``upto`` and cut after ``after``."""
        held = self._rest.pop(info.table, None)
        if held is None or (held.since, held.bound, held.after) != (since, upto, after) or upto is None:
            async with self._sessions.reading(f"read changes of {info.table}", False, info.table) as conn:
                rows, bound = await self._decode(conn, info, since, upto)
            if after is not None:
                cut = _order(*after)
                rows = [r for r in rows if _order(r.version, tuple(r.key.values())) > cut]
            held = _Held(since, bound, rows, after)
        page_rows, rest = held.rows[:limit], held.rows[limit:]
        if not rest:
            return ChangePage(page_rows, held.bound)
        last = page_rows[-1]
        cursor = (last.version, tuple(last.key.values()))
        self._rest[info.table] = _Held(since, held.bound, rest, cursor)
        return ChangePage(page_rows, held.bound, more=True, cursor=cursor)

    async def _decode(
        self, conn: Connection, info: TableInfo, since: int, upto: int | None
    ) -> tuple[list[ChangeRow], int]:
        name = self.slot(info.table, conn.info.dbname)
        found = await pg_logical.window(conn, name, info.schema, info.name)
        pg_logical.check_window(info.table, since, found)
        assert found.slot is not None
        self.retained_wal[info.table] = found.slot.retained
        target = min(self._stored.get(info.table, -1), since)
        if target > found.slot.confirmed:
            await pg_logical.advance(conn, name, target)
        decoded, bound = await self._peek(conn, name, since, found.flush, upto)
        bound = max(since, bound)
        taken = [t for t in decoded if since < t.commit_lsn <= bound]
        foreign = foreign_keys(taken, info.primary_key)
        if foreign:
            await pg_logical.check_logged_identity(conn, info.table, info.schema, info.name, foreign)
        # every shape of the read: a column added and dropped within it leaves
        # changes of a shape that is no longer the table's last
        await self._loaders.prepare(conn, {c.relation for t in decoded for c in t.changes if c.relation})
        net = NetChanges(
            info.primary_key, self._loaders.decoder(info, await self._loaders.generated(conn, info))
        )
        for transaction in taken:
            for change in transaction.changes:
                if change.kind == "T":
                    raise TrackingExpired(
                        info.table, f"the table was truncated (at WAL position {transaction.commit_lsn})"
                    )
                net.add(change, transaction.commit_lsn)
        rows = await self._rows(conn, info, net)
        rows.sort(key=lambda r: _order(r.version, tuple(r.key.values())))
        return rows, bound

    async def _peek(
        self, conn: Connection, name: str, since: int, flush: int, upto: int | None
    ) -> tuple[list[Transaction], int]:
        """The slot's transactions and the read's bound: up to ``upto`` when a
        paged read goes on, else those committing below ``flush``, at most
        ``DECODE_CHANGES`` messages (whole transactions, so the bound is then
        the last one's commit). A slice the checkpoint has passed entirely
        (the slot trails ``since``: a read ran ahead of what Redis holds) is
        taken again, larger, until it reaches past ``since``."""
        cap = DECODE_CHANGES
        while True:
            relations: dict[int, Relation] = {}
            until, most = (flush, cap) if upto is None else (upto + 1, None)
            messages = await pg_logical.peek(conn, name, until, most)
            self.decoded += len(messages)
            decoded = list(transactions(iter(messages), relations))
            if upto is not None:
                return decoded, upto
            if len(messages) < cap or not decoded:
                return decoded, flush - 1
            if decoded[-1].commit_lsn > since:
                return decoded, decoded[-1].commit_lsn
            cap *= 4

    async def _rows(self, conn: Connection, info: TableInfo, net: NetChanges) -> list[ChangeRow]:
        changes = list(net.items())
        # each row's published columns; a value the WAL did not carry (UNCHANGED) is read from the table
        published_rows = [None if v is None else {c: v[c] for c in info.column_names} for *_, v in changes]
        wanted = [
            change[0]
            for change, published in zip(changes, published_rows, strict=True)
            if published is not None and any(v is UNCHANGED for v in published.values())
        ]
        found_rows = await pg_keyed.current_rows(conn, info, wanted, ordinary=self._ordinary(info))
        current = dict(zip(wanted, found_rows, strict=True))
        rows = []
        for (key_values, op, version, _), published in zip(changes, published_rows, strict=True):
            key = dict(zip(info.primary_key, key_values, strict=True))
            if published is None:
                rows.append(ChangeRow("D", version, key, None))
                continue
            if key_values in current:
                found = current[key_values]
                if found is None:
                    continue  # gone since: its delete is in a later read
                published = {c: found[c] if v is UNCHANGED else v for c, v in published.items()}
            rows.append(ChangeRow(op, version, key, published))  # type: ignore[arg-type]
        return rows

    # -- snapshots ------------------------------------------------------------------

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
        """As the trigger mode's, in a view at a WAL position
        (``pg_logical_views``), the slot made first (again, when it was lost)
        so that the catch-up finds every change after the version."""
        async with self._sessions.guard(f"snapshot {info.table}", info.table):
            conn = await self._sessions.open()  # not the reader's: making a slot waits for transactions
            try:
                await self._ensure_slot(conn, info)
            finally:
                await conn.close()
        async with pg_logical_views.consistent_view(self._sessions, info, f"snapshot {info.table}") as (
            conn,
            version,
        ):
            async with self._sessions.guard(f"snapshot {info.table}", info.table):
                pg_reads.check_identity(info, await pg_logical_views.table_oid(conn, info))
                ordinary = self._ordinary(info)
                total = await pg_reads.estimated_rows(conn, info, ordinary=ordinary)
                bounds = pg_snapshot.Bounds(after, start, until)
                pages = pg_snapshot.encoded_pages if encoded else pg_snapshot.plain_pages
                async for page in pages(conn, info, version, total, page_size, bounds, ordinary):
                    yield page

    async def _ensure_slot(self, conn: Connection, info: TableInfo) -> None:
        """The table's slot, made again when it is missing or lost, as long as the
        table's publication says tracking is enabled (``disable`` drops both)."""
        name = self.slot(info.table, conn.info.dbname)
        found = await pg_logical.window(conn, name, info.schema, info.name)
        if not found.published:
            pg_logical.check_window(info.table, 0, found)
        if found.slot is None or found.slot.lost:
            await pg_logical.ensure_slot(conn, name)

    async def read_rows(self, info: TableInfo, keys: Sequence[dict[str, Any]]) -> KeyedRows:
        """The current rows of ``keys``, in a view taken as a snapshot's."""
        what = f"read rows of {info.table} by key"
        async with pg_logical_views.consistent_view(self._sessions, info, what) as (conn, version):
            async with self._sessions.guard(what, info.table):
                rows = await pg_keyed.rows_by_key(conn, info, keys, ordinary=self._ordinary(info))
        return KeyedRows(version, rows)

    # -- upkeep -----------------------------------------------------------------------

    async def retention(self) -> float | None:
        """None: a slot keeps its WAL until it moves (or ``max_slot_wal_keep_size``)."""
        return None

    async def cleanup(self, retention: float, scope: CleanupScope | None = None) -> int:
        """Nothing to delete: each slot moves with its table's checkpoint."""
        return 0

    # -- tracking administration (pg_logical_admin) ------------------------------------

    async def tracking_enable(self, tables: Sequence[TableConfig]) -> list[str]:
        return await pg_logical_admin.enable(self._sessions, self.slot, tables)

    async def tracking_disable(self, tables: Sequence[TableConfig]) -> list[str]:
        return await pg_logical_admin.disable(self._sessions, self.slot, tables)

    async def tracking_status(self, tables: Sequence[TableConfig]) -> list[TrackingStatus]:
        return await pg_logical_admin.status(self._sessions, self.slot, tables)

    async def other_slots(self, tables: Sequence[TableConfig]) -> list[str]:
        """The cdc slots of the database that none of ``tables`` (a whole config) uses."""
        return await pg_logical_admin.other_slots(self._sessions, self.slot, tables)

    async def grant_runtime(self, tables: Sequence[TableConfig], role: str) -> list[str]:
        return await pg_logical_admin.grant(self._sessions, tables, role)

    async def doctor(self, tables: Sequence[TableConfig]) -> list[Finding]:
        return await pg_logical_admin.doctor(self._sessions, self.slot, tables)
