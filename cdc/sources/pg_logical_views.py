"""Consistent views in logical capture: a snapshot's, and ``read_rows``'s.

The view's version ``v`` is a WAL position (``pg_logical.all_visible``
explains why every commit at or below it is in the view, and why a read of
changes from ``v`` brings every later one).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from cdc.errors import SourceUnavailable
from cdc.sources import pg_keyed, pg_logical, pg_reads
from cdc.sources.base import TableInfo
from cdc.sources.pg_catalog import Connection
from cdc.sources.pg_sessions import Sessions

# How often a view is tried while transactions that were committing have not
# ended (each try waits 20 ms): then the caller retries later, as after any
# SourceUnavailable.
ATTEMPTS = 250


@asynccontextmanager
async def consistent_view(
    sessions: Sessions, info: TableInfo, what: str
) -> AsyncIterator[tuple[Connection, int]]:
    """A connection of its own inside a REPEATABLE READ, READ ONLY transaction
    that holds the table's ACCESS SHARE lock (``pg_reads.lock_source``), and
    the view's version."""
    async with sessions.guard(what):
        conn = await sessions.open(reader=True)
    try:
        for _ in range(ATTEMPTS):
            async with sessions.guard(what, info.table):
                position, before = await pg_logical.position_before(conn)
            async with sessions.guard(what, info.table), conn.transaction():
                await pg_reads.lock_source(conn, info)
                if await pg_logical.all_visible(conn, before):
                    yield conn, position - 1
                    return
            await asyncio.sleep(0.02)
        raise SourceUnavailable(f"{info.table}: {what} waits for transactions that were committing to end")
    finally:
        await conn.close()


async def rows_by_key(
    conn: Connection, info: TableInfo, keys: Sequence[dict[str, Any]], *, ordinary: bool
) -> list[dict[str, Any] | None]:
    """Each key's row in the view (None: no such row), as ``pg_keyed`` reads them."""
    query = pg_keyed.rows_query(info, ordinary=ordinary)
    types = {c.name: c.type_name for c in info.columns}
    rows: list[dict[str, Any] | None] = []
    for key in keys:
        params = [pg_keyed.key_parameter(key[c], types.get(c, "")) for c in info.primary_key]
        record = await (await conn.execute(query, params)).fetchone()
        rows.append(None if record is None else dict(zip(info.column_names, record, strict=True)))
    return rows


async def table_oid(conn: Connection, info: TableInfo) -> int | None:
    row = await (
        await conn.execute(
            "select to_regclass(quote_ident(%s) || '.' || quote_ident(%s))::oid", [info.schema, info.name]
        )
    ).fetchone()
    return None if row is None else row[0]
