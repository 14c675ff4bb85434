"""A read's backlog and a snapshot's chunks against a real SQL Server.

What only a server settles (``mssql_dsn``: skipped with the reason where none
is reachable): that the backlog's CREATE TABLE and INSERT run inside the read's
SNAPSHOT transaction (MSSQLSERVER_3961 lists the DDL that may not; CREATE
TABLE is not among them) and that CHANGETABLE then runs at most twice per read
(sys.dm_exec_query_stats, which needs VIEW SERVER STATE); that a snapshot
survives an index rebuild mid-way; that a cancelled read leaves no transaction
open.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pyodbc
import pytest

from cdc.config import TableConfig
from cdc.sources import mssql_snapshot
from cdc.sources.base import ChangeRow
from cdc.sources.mssql import MssqlSource
from tests.cdc.sources.test_mssql_live import changes, run, scalar, source, table, tracked
from tests.e2e import wait_for

pytestmark = pytest.mark.mssql
__all__ = ["source", "table"]  # fixtures, used by name


def changetable_runs(dsn: str, table: str) -> int:
    """How many times the plan cache saw a statement reading CHANGETABLE of ``table`` run."""
    name = table.split(".", 1)[1]
    conn = pyodbc.connect(dsn, autocommit=True, timeout=30)
    try:
        row = conn.execute(
            "SELECT COALESCE(SUM(qs.execution_count), 0) FROM sys.dm_exec_query_stats AS qs "
            "CROSS APPLY sys.dm_exec_sql_text(qs.sql_handle) AS st "
            "WHERE st.text LIKE ? AND st.text NOT LIKE '%dm_exec_query_stats%'",
            f"%CHANGETABLE(CHANGES [[]dbo].[[]{name}]%",
        ).fetchone()
        return int(row[0])
    finally:
        conn.close()


async def test_a_read_of_many_pages_evaluates_changetable_at_most_twice(
    source: MssqlSource, table: TableConfig, mssql_dsn: str
) -> None:
    info = await tracked(source, table)
    start = await source.current_version()
    values = ", ".join(f"({i}, {i}.25, 's{i}')" for i in range(1, 301))
    run(mssql_dsn, f"INSERT INTO {table.table} (Id, Price, Status) VALUES {values}")
    run(mssql_dsn, f"UPDATE {table.table} SET Status = 'u' WHERE Id % 3 = 0")
    before = changetable_runs(mssql_dsn, table.table)
    rows, _ = await changes(source, info, start, limit=25)  # 12 pages
    assert [r.key["Id"] for r in rows] == list(range(1, 301)) and {r.op for r in rows} == {"I"}
    assert changetable_runs(mssql_dsn, table.table) - before <= 2
    # a second paged read on the same reader: the first one's backlog was dropped
    checkpoint = await source.current_version()
    run(mssql_dsn, f"UPDATE {table.table} SET Price = Price + 1 WHERE Id <= 60")
    again, _ = await changes(source, info, checkpoint, limit=25)
    assert [(r.op, r.key["Id"]) for r in again] == [("U", i) for i in range(1, 61)]
    assert all(r.changed_columns == frozenset({"Price", "Doubled"}) for r in again)


async def test_a_cancelled_read_with_a_backlog_leaves_no_transaction_open(
    source: MssqlSource, table: TableConfig, mssql_dsn: str
) -> None:
    info = await tracked(source, table)
    start = await source.current_version()
    values = ", ".join(f"({i}, 1, 'x')" for i in range(1, 51))
    run(mssql_dsn, f"INSERT INTO {table.table} (Id, Price, Status) VALUES {values}")
    held = asyncio.Event()

    async def tracker() -> None:
        page = await source.read_changes(info, start, limit=10)
        page = await source.read_changes(info, start, limit=10, upto=page.next_version, after=page.cursor)
        held.set()
        await asyncio.Event().wait()

    task = asyncio.create_task(tracker())
    await asyncio.wait_for(held.wait(), 30)
    assert open_transactions(mssql_dsn) == 1
    task.cancel()

    async def none_open() -> bool:
        return open_transactions(mssql_dsn) == 0

    await wait_for(none_open, 10, "the cancelled read's rollback")
    rows, _ = await changes(
        source, info, start, limit=10
    )  # the same reader, its backlog gone with the rollback
    assert [r.key["Id"] for r in rows] == list(range(1, 51))


def open_transactions(dsn: str) -> int:
    return int(
        scalar(
            dsn,
            "SELECT COUNT(*) FROM sys.dm_exec_sessions WHERE program_name = N'cdc-sync' "
            "AND open_transaction_count > 0",
        )
    )


async def test_a_snapshot_survives_an_index_rebuild_mid_way(
    source: MssqlSource, table: TableConfig, mssql_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 14 item 15: ALTER INDEX ... REBUILD commits while the snapshot's
    chunk is open; the snapshot continues after the last key, at its version."""
    info = await tracked(source, table)
    values = ", ".join(f"({i}, 1, 'x')" for i in range(1, 41))
    run(mssql_dsn, f"INSERT INTO {table.table} (Id, Price, Status) VALUES {values}")
    version = await source.current_version()
    seen: list[Any] = []
    versions = set()
    with caplog.at_level(logging.WARNING, logger="cdc.sources.mssql"):
        async for page in source.snapshot(info, page_size=10):
            seen += [r["Id"] for r in page.rows]
            versions.add(page.version)
            if len(seen) == 10:
                run(mssql_dsn, f"ALTER INDEX ALL ON {table.table} REBUILD")
    assert seen == list(range(1, 41)) and versions == {version}
    # whether SQL Server failed the chunk (3961) is what this shows: say it, do not require it
    print(
        "chunk resumed after the rebuild:", any("snapshot chunk failed" in r.message for r in caplog.records)
    )


async def test_a_snapshot_in_many_chunks_plus_the_catch_up_is_the_table(
    source: MssqlSource, table: TableConfig, mssql_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mssql_snapshot, "CHUNK_SECONDS", 0.0)
    info = await tracked(source, table)
    values = ", ".join(f"({i}, {i}, 'x')" for i in range(1, 31))
    run(mssql_dsn, f"INSERT INTO {table.table} (Id, Price, Status) VALUES {values}")
    replica: dict[int, dict[str, Any]] = {}
    version = None
    pages = 0
    async for page in source.snapshot(info, page_size=5):
        version = page.version
        replica.update({r["Id"]: r for r in page.rows})
        pages += 1
        run(
            mssql_dsn,
            f"UPDATE {table.table} SET Price = Price + 100 WHERE Id IN ({pages * 5 - 2}, {pages * 5 + 3})",
            f"DELETE FROM {table.table} WHERE Id = {pages * 5 + 4}",
            f"INSERT INTO {table.table} (Id, Price, Status) VALUES ({1000 + pages}, 0, 'new')",
        )
    assert version is not None
    rows: list[ChangeRow]
    rows, _ = await changes(source, info, version, limit=7)
    for row in rows:
        if row.op == "D":
            replica.pop(row.key["Id"], None)
        else:
            assert row.values is not None
            replica[row.key["Id"]] = row.values
    now = [
        dict(zip(("Id", "Price", "Status", "Doubled"), r, strict=True)) for r in table_rows(mssql_dsn, table)
    ]
    assert replica == {r["Id"]: r for r in now}


def table_rows(dsn: str, table: TableConfig) -> list[Any]:
    conn = pyodbc.connect(dsn, autocommit=True, timeout=30)
    try:
        return [
            tuple(r)
            for r in conn.execute(f"SELECT Id, Price, Status, Doubled FROM {table.table} ORDER BY Id")
        ]
    finally:
        conn.close()
