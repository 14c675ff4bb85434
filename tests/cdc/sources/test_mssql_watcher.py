"""The SQL Server version watcher, database identity and TRUNCATE, without a SQL Server.

- The statements parse with sqlglot's T-SQL dialect (``parse`` of
  test_mssql_sql, which knows the two constructs sqlglot lacks).
- The watcher's scheduling runs against the in-memory source through its
  seam (``observe``: any coroutine that reads a ``Tick``): wake-ups within a
  tick, what a failing watcher does.
- The source's part (skipped reads, the database checked, a TRUNCATE seen by a
  caught-up poller, tracking turned off and on between polls) runs on
  ``WatchedOdbc``, the recording stand-in of test_mssql_sql taught the tick.
  What SQL Server itself does is for test_mssql_watcher_live.py.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import pyodbc
import pytest

from cdc.config import TableConfig
from cdc.errors import SchemaError, SourceUnavailable, TrackingNotEnabled, TransientError
from cdc.shapes import identity_change, shape_change
from cdc.sources import mssql_sql as sql
from cdc.sources import mssql_sql_catalog as catalog_sql
from cdc.sources import mssql_watcher
from cdc.sources.base import TableInfo
from cdc.sources.memory import MemorySource
from cdc.sources.mssql import MssqlSource
from cdc.sources.mssql_reads import check_identity
from cdc.sources.mssql_watcher import Tick, VersionWatcher
from tests.cdc.sources.test_mssql_sql import (
    CONFIG,
    FakeConnection,
    FakeOdbc,
    parse,
    placeholders,
    table_config,
)
from tests.e2e import wait_for


def sees(watcher: VersionWatcher, database: str) -> bool:
    seen = watcher.latest()
    return seen is not None and seen.tick.database == database


async def until(predicate: Any) -> None:
    """Wait for ``predicate()`` to hold, with a deadline."""

    async def check() -> bool:
        return bool(predicate())

    await wait_for(check, 5, "the condition")


DB1 = "database 6f9619ff-8b86-d011-b42d-00c04fc964ff; fork 0b3b2f55-4a06-4c47-9d2b-8d1a6b1d4c10"
DB2 = "database 6f9619ff-8b86-d011-b42d-00c04fc964ff; fork 9e4c1f0a-1111-4c47-9d2b-8d1a6b1d4c10"

# -- statements --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "statement",
    [
        sql.WATCH_TICK,
        sql.DATABASE_IDENTITY,
        sql.min_valid_version("dbo", "T"),
        catalog_sql.fingerprints([("dbo", "T")]),
    ],
    ids=["tick", "database", "min_valid", "fingerprint"],
)
def test_the_identity_and_watcher_statements_parse(statement: sql.Statement) -> None:
    assert placeholders(parse(statement)) == len(statement.params)


def test_the_tick_reads_the_version_the_database_identity_and_the_tracked_tables() -> None:
    text = sql.WATCH_TICK.sql
    for part in (
        "CHANGE_TRACKING_CURRENT_VERSION()",
        "drs.database_guid",
        "drs.recovery_fork_guid",
        "sys.database_recovery_status",
        "DB_ID()",
        "begin_version",
        "sys.change_tracking_tables",
    ):
        assert part in text
    assert "BEGIN" not in text and "?" not in text  # no transaction, no parameter: one cheap statement


def test_a_tables_identity_holds_its_tracking_start_and_its_database() -> None:
    fingerprint = catalog_sql.fingerprints([("dbo", "T")]).sql
    assert "ctt.begin_version" in fingerprint and "drs.recovery_fork_guid" in fingerprint
    read = sql.min_valid_version("dbo", "T").sql
    assert (
        "begin_version" in read and "database_recovery_status" not in read
    )  # never in a SNAPSHOT transaction


# -- identity changes in words ------------------------------------------------------------


def info(identity: str) -> TableInfo:
    return TableInfo("dbo.T", "dbo", "T", ("Id",), (), identity=identity)


def test_a_restore_a_truncate_and_a_new_table_are_told_apart() -> None:
    """On main every identity change read "the table was dropped and created again"."""
    base = f"object 1000; tracking since 5; {DB1}"
    restored = shape_change(info(base), info(f"object 1000; tracking since 5; {DB2}"))
    assert restored is not None and restored.startswith(
        "the database was restored from a backup, or failed over"
    )
    truncated = shape_change(info(base), info(f"object 1000; tracking since 9; {DB1}"))
    assert truncated is not None and truncated.startswith("the table was truncated")
    assert "tracking since 5, now 9" in truncated
    assert shape_change(info(base), info(f"object 2000; tracking since 9; {DB1}")) == (
        "the table was dropped and created again"
    )
    assert identity_change("16384", "16999") == "the table was dropped and created again"  # PostgreSQL's oid


def test_a_read_checks_the_tracking_start_of_the_table() -> None:
    described = info(f"object 1000; tracking since 5; {DB1}")
    check_identity(described, "object 1000; tracking since 5")  # the database's part is checked elsewhere
    with pytest.raises(SchemaError, match=r"dbo\.T: the table was truncated.*described again"):
        check_identity(described, "object 1000; tracking since 9")
    with pytest.raises(SchemaError, match="dropped and created again"):
        check_identity(described, "object 2000; tracking since 9")


# -- the watcher's scheduling, on the in-memory source ----------------------------------------


def memory_ticks(db: MemorySource, database: list[str]) -> Any:
    async def observe() -> Tick:
        return Tick(await db.current_version(), database[0], "1 5 77")

    return observe


async def memory_db() -> MemorySource:
    db = MemorySource()
    db.create_table("dbo.T", {"Id": "int", "V": "text"}, ("Id",))
    return db


async def test_a_moved_version_wakes_the_tables_within_a_tick() -> None:
    db = await memory_db()
    watcher = VersionWatcher(memory_ticks(db, [DB1]), lambda: {"dbo.T", "dbo.U"}, tick=0.01)
    try:
        assert await watcher.wait(0.05) == set()  # started, nothing moved
        await until(lambda: watcher.latest() is not None)
        woken = asyncio.create_task(watcher.wait(10))
        loop = asyncio.get_running_loop()
        start = loop.time()
        db.insert("dbo.T", {"Id": 1, "V": "a"})
        assert await woken == {"dbo.T", "dbo.U"}
        assert loop.time() - start < 1.0
    finally:
        await watcher.close()


async def test_another_database_identity_wakes_the_tables() -> None:
    db = await memory_db()
    database = [DB1]
    watcher = VersionWatcher(memory_ticks(db, database), lambda: {"dbo.T"}, tick=0.01)
    try:
        await watcher.wait(0.01)
        await until(lambda: watcher.latest() is not None)
        database[0] = DB2  # restored: the version need not move
        assert await watcher.wait(10) == {"dbo.T"}
        seen = watcher.latest()
        assert seen is not None and seen.tick.database == DB2
    finally:
        await watcher.close()


async def test_a_failing_watcher_wakes_everyone_and_is_no_evidence(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mssql_watcher, "RETRY_TICK", 0.01)
    db = await memory_db()
    watcher = VersionWatcher(memory_ticks(db, [DB1]), lambda: {"dbo.T"}, tick=0.01)
    try:
        await watcher.wait(0.01)
        await until(lambda: watcher.latest() is not None)
        db.available = False  # every call raises SourceUnavailable
        assert await watcher.wait(10) == {"dbo.T"}
        assert watcher.latest() is None
        db.available = True
        await until(lambda: watcher.latest() is not None)  # it kept trying
    finally:
        await watcher.close()


# -- the source: skipped reads, the database checked, TRUNCATE, tracking off and on ----------


class WatchedOdbc(FakeOdbc):
    """FakeOdbc with labelled identities and the watcher's tick answered."""

    def __init__(self) -> None:
        super().__init__()
        self.begin_version = 5
        self.database_identity = DB1
        self.tracked_summary = "1 5 77"
        self.fingerprint = "shape 1"

    def answer(self, text: str, params: tuple[Any, ...], conn: FakeConnection) -> list[tuple[Any, ...]]:
        self.object_id = None if self.object_id is None else 1000
        rows = super().answer(text, params, conn)
        table = (
            None
            if self.object_id is None
            else f"object {self.object_id}; tracking since {self.begin_version}"
        )
        if text == sql.WATCH_TICK.sql:
            return [(self.current, self.database_identity, self.tracked_summary)]
        if text == sql.DATABASE_IDENTITY.sql:
            return [(self.database_identity,)]
        if "AS fingerprint FROM (VALUES" in text:  # rows (n, identity, fingerprint): scripted here
            whole = None if table is None else f"{table}; {self.database_identity}"
            return [(n, None if ident is None else whole, fp and f"{whole}; {fp}") for n, ident, fp in rows]
        if "AS min_valid_version, CASE" in text:  # the read's (min valid, table identity)
            return [(rows[0][0], table)]
        return rows


@pytest.fixture
def odbc(monkeypatch: pytest.MonkeyPatch) -> WatchedOdbc:
    monkeypatch.setattr(mssql_watcher, "RETRY_TICK", 0.01)
    return WatchedOdbc()


async def watched(odbc: WatchedOdbc, config: TableConfig | None = None) -> tuple[MssqlSource, TableInfo]:
    source = MssqlSource(CONFIG, connector=odbc.connect)
    source._watcher._tick = 0.01  # (the default 100 ms would do; the tests wait less)
    await source.connect()
    described = await source.describe(config or table_config())
    assert described.identity == f"object 1000; tracking since 5; {DB1}"
    return source, described


async def watching(source: MssqlSource) -> None:
    await source.wait_for_changes(0.01)  # the pipeline's listen loop starts the watcher
    await until(lambda: source._watcher.latest() is not None)


def transactions(odbc: WatchedOdbc) -> int:
    return sum(1 for kind in odbc.statements() if kind == "BEGIN")


async def test_an_idle_read_is_answered_without_a_round_trip_and_waits_for_a_wake_up(
    odbc: WatchedOdbc,
) -> None:
    """On main every read is a SNAPSHOT transaction and quiet_for is 0."""
    source, described = await watched(odbc)
    try:
        await watching(source)
        first = await source.read_changes(described, 10, limit=100)  # goes to the server once
        assert first.next_version == 10 and transactions(odbc) == 1
        for _ in range(20):
            page = await source.read_changes(described, 10, limit=100)
            assert (page.rows, page.next_version, page.more) == ([], 10, False)
        assert transactions(odbc) == 1
        assert 20 < source.quiet_for(described, 10) <= mssql_watcher.QUIET_READ_LIMIT
        assert source.quiet_for(described, 9) == 0.0  # not the version the database is at
    finally:
        await source.close()


async def test_a_change_wakes_the_table_and_its_read_goes_to_the_server(odbc: WatchedOdbc) -> None:
    source, described = await watched(odbc)
    try:
        await watching(source)
        await source.read_changes(described, 10, limit=100)
        odbc.db.execute("INSERT INTO dbo.\"Forecasts\" VALUES (1, '1.00', 'a', 2)")
        odbc.db.execute("INSERT INTO ct_src VALUES (11, 11, 'I', NULL, 1)")
        odbc.current = 11
        assert await source.wait_for_changes(10) == {"dbo.Forecasts"}
        assert source.quiet_for(described, 10) == 0.0
        page = await source.read_changes(described, 10, limit=100)
        assert [(r.op, r.key) for r in page.rows] == [("I", {"Id": 1})] and page.next_version == 11
        assert transactions(odbc) == 2
    finally:
        await source.close()


async def test_a_truncate_is_seen_by_a_caught_up_poller(odbc: WatchedOdbc) -> None:
    """TRUNCATE resets begin_version; with nothing committed since, no version
    check can tell (on main the read passes: min valid 10 = since)."""
    source, described = await watched(odbc)
    try:
        await watching(source)
        await source.read_changes(described, 10, limit=100)
        odbc.begin_version, odbc.min_valid, odbc.tracked_summary = 10, 10, "1 10 91"  # TRUNCATE TABLE
        await source.wait_for_changes(10)  # the tracked tables' summary moved: everyone wakes
        with pytest.raises(SchemaError, match=r"dbo\.Forecasts: the table was truncated.*described again"):
            await source.read_changes(described, 10, limit=100)
        now = await source.describe(table_config())
        reason = shape_change(described, now)
        assert reason is not None and "truncated" in reason and "tracking since 5, now 10" in reason
    finally:
        await source.close()


async def test_a_restored_database_is_noticed_by_the_next_read(odbc: WatchedOdbc) -> None:
    """With the watcher, from its tick; without it, read on the spot."""
    for watching_it in (True, False):
        odbc.database_identity = DB1
        source, described = await watched(odbc)
        try:
            if watching_it:
                await watching(source)
            odbc.database_identity = DB2  # RESTORE DATABASE ... WITH REPLACE: a new recovery fork
            if watching_it:
                await until(functools.partial(sees, source._watcher, DB2))
            odbc.log.clear()
            with pytest.raises(SchemaError, match=r"dbo\.Forecasts: the database was restored from a backup"):
                await source.read_changes(described, 10, limit=100)
            assert "BEGIN" not in odbc.statements()  # refused before any transaction
            reason = shape_change(described, await source.describe(table_config()))
            assert reason is not None and reason.startswith("the database was restored")
        finally:
            await source.close()


async def test_a_lost_watcher_falls_back_to_reading(odbc: WatchedOdbc) -> None:
    source, described = await watched(odbc)
    try:
        await watching(source)
        await source.read_changes(described, 10, limit=100)
        assert source.quiet_for(described, 10) > 0
        odbc.fail = lambda text: (
            pyodbc.OperationalError("08S01", "[08S01] Communication link failure")
            if text == sql.WATCH_TICK.sql
            else None
        )
        assert await source.wait_for_changes(10) == {"dbo.Forecasts"}  # everyone woken at once
        assert source.quiet_for(described, 10) == 0.0
        before = transactions(odbc)
        await source.read_changes(described, 10, limit=100)
        assert transactions(odbc) == before + 1  # no read is answered while the watcher is down
    finally:
        await source.close()


async def test_close_stops_the_watcher_and_closes_its_connection(odbc: WatchedOdbc) -> None:
    source, _ = await watched(odbc)
    await watching(source)
    pump = source._watcher._pump
    await source.close()
    assert pump is not None and pump.done() and source._watcher.latest() is None
    assert odbc.statements().count("CLOSE") >= 2  # describe's link and the watcher's


async def test_a_snapshot_the_minimum_valid_version_passes_is_retried_not_expired(odbc: WatchedOdbc) -> None:
    """Its version would be an expired checkpoint at once: on main the snapshot
    succeeded, the first read expired, the table was snapshotted again, with no
    delay between. A TransientError waits the tracker's retry wait instead."""
    source, described = await watched(odbc)
    try:
        odbc.min_valid, odbc.current = 11, 10
        with pytest.raises(
            SourceUnavailable, match=r"dbo\.Forecasts: .*starts at version 11.*current version 10"
        ):
            [page async for page in source.snapshot(described, page_size=10)]
        assert isinstance(SourceUnavailable("x"), TransientError)
        odbc.current = 11  # something committed
        pages = [page async for page in source.snapshot(described, page_size=10)]
        assert pages[0].version == 11
    finally:
        await source.close()


async def test_column_tracking_turned_on_between_polls_is_read_at_once(odbc: WatchedOdbc) -> None:
    """Issue 14 item 11: DISABLE, then ENABLE ... WITH (TRACK_COLUMNS_UPDATED = ON).
    A poll in between is an error of the table (TrackingNotEnabled, the tracker
    degrades it and describes it again), never the process's. A poller that
    misses the window meets a new begin_version: described again, so the column
    masks are read from then on. On main the read expired (TrackingExpired),
    the snapshot used the cached description, and masks stayed unread until a
    restart or the 2 s fingerprint poll."""
    odbc.tracking = [(0, 0)]  # tracked, columns updated OFF
    source, described = await watched(odbc)
    try:
        odbc.tracking, odbc.min_valid = [], None  # ALTER TABLE ... DISABLE CHANGE_TRACKING
        with pytest.raises(TrackingNotEnabled, match="cdc tracking enable --table dbo.Forecasts"):
            await source.read_changes(described, 10, limit=100)
        odbc.tracking, odbc.min_valid, odbc.begin_version = [(1, 0)], 10, 10  # ENABLE, columns ON
        with pytest.raises(SchemaError, match="change tracking turned off and on again"):
            await source.read_changes(described, 10, limit=100)
        again = await source.describe(table_config())  # what the tracker does after a SchemaError
        assert shape_change(described, again) is not None  # and so it snapshots the table
        odbc.db.execute("INSERT INTO dbo.\"Forecasts\" VALUES (1, '1.00', 'a', 2)")
        odbc.db.execute("INSERT INTO ct_src VALUES (11, 1, 'U', 'Price', 1)")
        odbc.current = 11
        [row] = (await source.read_changes(again, 10, limit=100)).rows
        assert row.changed_columns == frozenset({"Price", "Doubled"})
    finally:
        await source.close()


def test_the_default_tick_is_a_tenth_of_a_second() -> None:
    assert mssql_watcher.TICK == 0.1 and mssql_watcher.STALE >= 5 * mssql_watcher.TICK
