"""A read's backlog and a snapshot's chunks, on the recording stand-in.

``FakeOdbc`` (test_mssql_sql.py) runs the statements on sqlite, with a copy
of the data per transaction: it checks the statements' order and logic, never
SQL Server's behaviour (test_mssql_backlog_live.py does, where a server is
reachable).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pyodbc
import pytest

from cdc.errors import SourceUnavailable, TrackingExpired
from cdc.sources import mssql_snapshot
from cdc.sources.base import ChangeRow, SnapshotPage
from tests.cdc.sources.test_mssql_sql import FakeOdbc, described, fake, put, read_trail
from tests.e2e import wait_for

__all__ = ["fake"]  # the fixture, used by name


def _3961(text: str) -> pyodbc.Error:
    return pyodbc.ProgrammingError(
        "42000",
        "[42000] [FreeTDS][SQL Server]Snapshot isolation transaction failed in database 'CdcDemo' because "
        "the object accessed by the statement has been modified by a DDL statement in another concurrent "
        "transaction since the start of this transaction. (3961) (SQLExecDirectW)",
    )


# -- a read's backlog ----------------------------------------------------------------


async def test_a_read_of_many_pages_evaluates_changetable_at_most_twice(fake: FakeOdbc) -> None:
    """Issue 14 item 3: every page used to run the whole CHANGETABLE query
    again. Ten pages: the first page's TOP query, then one fill of the backlog."""
    source, info = await described(fake)
    put(
        fake,
        [(i, "1.00", "s", 2) for i in range(1, 31)],
        [(6 + i % 4, 1, "U", None, i) for i in range(1, 31)],
    )
    fake.log.clear()
    delivered: list[ChangeRow] = []
    page = await source.read_changes(info, 5, limit=3)
    delivered += page.rows
    pages = 1
    while page.more:
        page = await source.read_changes(info, 5, limit=3, upto=page.next_version, after=page.cursor)
        delivered += page.rows
        pages += 1
    assert pages == 10
    assert sum("CHANGETABLE" in text for text, _ in fake.log) == 2
    assert [(r.version, r.key["Id"]) for r in delivered] == sorted((6 + i % 4, i) for i in range(1, 31))
    await source.close()


async def test_a_read_cancelled_after_its_backlog_is_filled_rolls_it_back(fake: FakeOdbc) -> None:
    """The cancellation path (item 2) with a backlog: the rollback undoes the
    backlog's CREATE TABLE with the transaction, and the reader reads again."""
    source, info = await described(fake)
    put(fake, [(i, "1.00", "s", 2) for i in range(1, 8)], [(6, 1, "U", None, i) for i in range(1, 8)])
    second_page = asyncio.Event()

    async def tracker() -> None:
        page = await source.read_changes(info, 5, limit=2)
        page = await source.read_changes(info, 5, limit=2, upto=page.next_version, after=page.cursor)
        assert page.more
        second_page.set()
        await asyncio.Event().wait()  # feeding the page to Redis, until cancelled

    task = asyncio.create_task(tracker())
    await asyncio.wait_for(second_page.wait(), 5)
    [reader] = {n for kind, n in fake.trail if kind == "FILL BACKLOG"}
    task.cancel()

    async def rolled_back() -> bool:
        return ("ROLLBACK", reader) in fake.trail

    await wait_for(rolled_back, 5, "the held read's rollback")
    assert "COMMIT" not in fake.statements()
    fake.trail.clear()
    rows: list[ChangeRow] = []
    page = await source.read_changes(info, 5, limit=2)
    rows += page.rows
    while page.more:
        page = await source.read_changes(info, 5, limit=2, upto=page.next_version, after=page.cursor)
        rows += page.rows
    assert [r.key["Id"] for r in rows] == list(range(1, 8))
    assert {n for _, n in read_trail(fake)} == {reader} and fake.connections == 2
    await source.close()


async def test_a_backlog_page_that_fails_rolls_back_and_the_read_continues_anew(fake: FakeOdbc) -> None:
    """A link failure on a backlog page: the held transaction is gone; the
    continuation opens a new one from (upto, after), complete as before."""
    source, info = await described(fake)
    put(fake, [(i, "1.00", "s", 2) for i in range(1, 8)], [(6, 1, "U", None, i) for i in range(1, 8)])
    page = await source.read_changes(info, 5, limit=2)
    page = await source.read_changes(info, 5, limit=2, upto=page.next_version, after=page.cursor)
    delivered = [r.key["Id"] for r in page.rows]
    fake.fail = lambda text: (
        pyodbc.OperationalError("08S01", "[08S01] Communication link failure (SQLExecDirectW)")
        if "FROM #cdc_changes" in text
        else None
    )
    with pytest.raises(SourceUnavailable):
        await source.read_changes(info, 5, limit=2, upto=page.next_version, after=page.cursor)
    fake.fail = lambda text: None
    rest: list[ChangeRow] = []
    again = await source.read_changes(info, 5, limit=2, upto=page.next_version, after=page.cursor)
    rest += again.rows
    while again.more:
        again = await source.read_changes(info, 5, limit=2, upto=again.next_version, after=again.cursor)
        rest += again.rows
    assert delivered + [r.key["Id"] for r in rest] == [3, 4, 5, 6, 7]
    await source.close()


# -- a snapshot's chunks ---------------------------------------------------------------


async def snapshot_pages(fake: FakeOdbc, page_size: int, between: Any = None) -> list[SnapshotPage]:
    source, info = await described(fake)
    pages = []
    async for page in source.snapshot(info, page_size=page_size):
        pages.append(page)
        if between is not None:
            between(len(pages))
    await source.close()
    return pages


async def test_a_chunk_commits_when_due_and_the_next_page_opens_the_next(
    fake: FakeOdbc, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mssql_snapshot, "CHUNK_SECONDS", 0.0)  # every page a chunk of its own
    put(fake, [(i, f"{i}.00", "s", 2 * i) for i in range(1, 6)], [])
    fake.log.clear()
    pages = await snapshot_pages(fake, page_size=2)
    assert [[r["Id"] for r in p.rows] for p in pages] == [[1, 2], [3, 4], [5]]
    assert {p.version for p in pages} == {10}
    kinds = fake.statements()
    kinds = kinds[kinds.index("ESTIMATE") - 1 : kinds.index("CLOSE")]
    assert kinds == [
        "READ COMMITTED", "ESTIMATE", "SNAPSHOT", "BEGIN", "CURRENT", "MIN_VALID", "PAGE", "COMMIT",
        "SNAPSHOT", "BEGIN", "MIN_VALID", "PAGE", "COMMIT",
        "SNAPSHOT", "BEGIN", "MIN_VALID", "PAGE", "COMMIT", "MIN_VALID",
        "ROLLBACK",  # closing the link (nothing open: a no-op, IF @@TRANCOUNT > 0)
    ]  # fmt: skip


async def test_a_snapshot_continues_after_3961_from_the_last_key(
    fake: FakeOdbc, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 14 item 15: DDL (an index rebuild) on the table commits while the
    snapshot reads it: the page fails with 3961; the snapshot goes on after
    the last key read, in a new transaction on a new connection, at the same
    version, no row read twice or lost. On main it failed and started over."""
    put(fake, [(i, "1.00", "s", 2) for i in range(1, 8)], [])
    failures = iter([True])

    def rebuild(pages_read: int) -> None:
        if pages_read == 2:
            fake.fail = lambda text: (
                _3961(text) if text.startswith("SELECT TOP (?) t.") and next(failures, False) else None
            )

    pages = await snapshot_pages(fake, page_size=2, between=rebuild)
    assert [r["Id"] for p in pages for r in p.rows] == list(range(1, 8))
    assert {p.version for p in pages} == {10}
    kinds = fake.statements()
    failed = kinds.index("CLOSE")  # the link dropped the connection after the transient error
    assert kinds[failed - 2 : failed + 5] == [
        "PAGE",
        "ROLLBACK",
        "CLOSE",
        "SNAPSHOT",
        "BEGIN",
        "MIN_VALID",
        "PAGE",
    ]
    page_params = [p for t, p in fake.log if t.startswith("SELECT TOP (?) t.")]
    assert page_params[2] == page_params[3]  # the failed page asked again, after the same key


async def test_a_snapshot_gives_up_after_failing_chunks_in_a_row(
    fake: FakeOdbc, monkeypatch: pytest.MonkeyPatch
) -> None:
    put(fake, [(i, "1.00", "s", 2) for i in range(1, 8)], [])
    source, info = await described(fake)
    snapshot = source.snapshot(info, page_size=2)
    await snapshot.__anext__()
    fake.fail = lambda text: _3961(text) if text.startswith("SELECT TOP (?) t.") else None
    with pytest.raises(SourceUnavailable, match="3961"):
        await snapshot.__anext__()
    assert fake.statements().count("PAGE") == 1 + 1 + mssql_snapshot.RESUMES
    await source.close()


@pytest.mark.parametrize("where", ["a later chunk", "the end"])
async def test_a_snapshot_whose_version_expired_meanwhile_is_tracking_expired(
    fake: FakeOdbc, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """Cleanup ran past the snapshot's version while it read the table: the
    changes made meanwhile cannot be read, so the snapshot is no good."""
    monkeypatch.setattr(mssql_snapshot, "CHUNK_SECONDS", 0.0 if where == "a later chunk" else 3600.0)
    put(fake, [(i, "1.00", "s", 2) for i in range(1, 6)], [])

    def cleanup(pages_read: int) -> None:
        if pages_read == 1:
            fake.min_valid = 11  # above the snapshot's version, 10

    with pytest.raises(
        TrackingExpired, match=r"dbo\.Forecasts: .*rose to 11 while the table was snapshotted at 10"
    ):
        await snapshot_pages(fake, page_size=2, between=cleanup)


async def test_chunks_plus_the_catch_up_from_the_version_give_the_table(
    fake: FakeOdbc, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What chunks give up, and what makes up for it: writers change rows
    ahead of and behind the snapshot between chunks; the snapshot at its
    version, then the net changes after it (as the tracker reads them),
    give the table exactly."""
    monkeypatch.setattr(mssql_snapshot, "CHUNK_SECONDS", 0.0)
    put(fake, [(i, f"{i}.00", "s", 2 * i) for i in range(1, 11)], [])
    version = 11
    fake.current = 10

    def write(pages_read: int) -> None:
        nonlocal version
        writes = {
            1: [("UPDATE", 7), ("DELETE", 8), ("INSERT", 20)],  # ahead of the snapshot
            2: [("UPDATE", 1), ("DELETE", 2)],  # behind it
            3: [("DELETE", 9), ("INSERT", 9)],  # ahead: deleted and inserted again
        }.get(pages_read, [])
        for op, key in writes:
            if op == "UPDATE":
                fake.db.execute(
                    'UPDATE dbo."Forecasts" SET "Price" = ? WHERE "Id" = ?', (f"{version}.50", key)
                )
            elif op == "DELETE":
                fake.db.execute('DELETE FROM dbo."Forecasts" WHERE "Id" = ?', (key,))
            else:
                fake.db.execute('INSERT INTO dbo."Forecasts" VALUES (?, ?, ?, ?)', (key, "0.00", "new", 0))
            fake.db.execute("DELETE FROM ct_src WHERE Id = ?", (key,))
            fake.db.execute("INSERT INTO ct_src VALUES (?, ?, ?, NULL, ?)", (version, version, op[0], key))
            fake.current = version
            version += 1

    source, info = await described(fake)
    replica: dict[int, dict[str, Any]] = {}
    pages_read = 0
    async for page in source.snapshot(info, page_size=3):
        snapshot_version = page.version
        replica.update({r["Id"]: r for r in page.rows})
        pages_read += 1
        write(pages_read)
    assert snapshot_version == 10
    assert 8 not in replica and replica[7]["Price"] != 7  # a later chunk saw rows as they were then
    page = await source.read_changes(info, snapshot_version, limit=100)
    for row in page.rows:
        if row.op == "D":
            replica.pop(row.key["Id"], None)
        else:
            assert row.values is not None
            replica[row.key["Id"]] = row.values
    table = fake.db.execute('SELECT "Id", "Price", "Status", "Doubled" FROM dbo."Forecasts"').fetchall()
    assert {k: (str(v["Price"]), v["Status"]) for k, v in replica.items()} == {
        r[0]: (r[1], r[2]) for r in table
    }
    await source.close()
