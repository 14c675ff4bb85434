"""Consistent views in logical capture: a snapshot's, and ``read_rows``'s.

The view's version ``v`` is a WAL position (``pg_logical.still_committing``
explains why every commit at or below it is in the view, and why a read of
changes from ``v`` brings every later one).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from cdc.errors import SourceUnavailable
from cdc.sources import pg_logical, pg_reads
from cdc.sources.base import TableInfo
from cdc.sources.pg_catalog import Connection
from cdc.sources.pg_sessions import Sessions

log = logging.getLogger("cdc.sources.postgres")

# How long a view waits for the transactions that were committing when its
# version was read (a commit held by a synchronous standby lasts until the
# standby answers), and how often it says which ones it waits for. Then the
# caller retries later, as after any SourceUnavailable, with a new version.
WAIT_SECONDS = 30.0
REPORT_EVERY = 5.0
FIRST_REPORT = 1.0  # a WAL flush ends well within it: only a held commit is reported
_POLL = (0.01, 0.2)  # first and longest pause between two looks


@asynccontextmanager
async def consistent_view(
    sessions: Sessions, info: TableInfo, what: str
) -> AsyncIterator[tuple[Connection, int]]:
    """A connection of its own inside a REPEATABLE READ, READ ONLY transaction
    that holds the table's ACCESS SHARE lock (``pg_reads.lock_source``), and
    the view's version. Its start (P and N) is kept across the tries: only the
    transactions that were running then are waited for, never later ones."""
    async with sessions.guard(what):
        conn = await sessions.open(reader=True)
    try:
        async with sessions.guard(what, info.table):
            start = await pg_logical.view_start(conn)
        began = time.monotonic()
        reported, pause = began + FIRST_REPORT - REPORT_EVERY, _POLL[0]
        while True:
            async with sessions.guard(what, info.table), conn.transaction():
                await pg_reads.lock_source(conn, info)
                waiting = await pg_logical.still_committing(conn, start)
                if not waiting:
                    yield conn, start.position - 1
                    return
            now = time.monotonic()
            if now - began >= WAIT_SECONDS:
                raise SourceUnavailable(f"{info.table}: {what} {_waits(waiting, now - began)}")
            if now - reported >= REPORT_EVERY:
                reported = now
                log.warning(
                    f"{info.table}: {what} {_waits(waiting, now - began)}", extra={"table": info.table}
                )
            await asyncio.sleep(pause)
            pause = min(pause * 2, _POLL[1])
    finally:
        await conn.close()


def _waits(waiting: Sequence[pg_logical.Committing], waited: float) -> str:
    shown = ", ".join(str(w) for w in waiting[:5]) + (
        f" and {len(waiting) - 5} more" if len(waiting) > 5 else ""
    )
    return (
        f"waits for transactions that may have been committing when its version was read, for"
        f" {waited:.0f}s (of {WAIT_SECONDS:.0f}s): {shown} (running then and not idle in a transaction;"
        " a long statement ends when it ends, a commit held by a synchronous standby when the standby"
        " answers, a prepared transaction with COMMIT or ROLLBACK PREPARED)"
    )


async def table_oid(conn: Connection, info: TableInfo) -> int | None:
    row = await (
        await conn.execute(
            "select to_regclass(quote_ident(%s) || '.' || quote_ident(%s))::oid", [info.schema, info.name]
        )
    ).fetchone()
    return None if row is None else row[0]
