"""The version watcher, TRUNCATE, tracking turned off and on, and a restore, on a real SQL Server.

They run where ``mssql_dsn`` finds a server (CDC_TEST_MSSQL_DSN, or a SQL
Server 2022 container when a Docker engine answers) and are skipped with the
reason otherwise; none has run yet. Each checks what SQL Server itself does
where the design relies on it: TRUNCATE resets begin_version, DISABLE +
ENABLE gives a new one, RESTORE ... WITH REPLACE of an earlier backup gives
another recovery_fork_guid (or database_guid), and the watcher's tick moves
with a commit.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator

import pyodbc
import pytest

from cdc.config import SourceConfig, TableConfig
from cdc.errors import SchemaError, TrackingExpired
from cdc.shapes import identity_parts, shape_change
from cdc.sources.mssql import MssqlSource
from cdc.sources.mssql_dsn import parse_dsn
from cdc.templates import Template
from tests.cdc.sources.test_mssql_live import changes, run, scalar, tracked

pytestmark = pytest.mark.mssql


def config(name: str) -> TableConfig:
    return TableConfig(
        table=f"dbo.{name}",
        schema="dbo",
        name=name,
        section=name.lower(),
        partition=Template.parse("app1"),
        key=None,
        columns=None,
    )


@pytest.fixture
def table(mssql_dsn: str) -> Iterator[TableConfig]:
    name = "Watched_" + uuid.uuid4().hex[:8]
    run(mssql_dsn, f"CREATE TABLE dbo.{name} (Id int NOT NULL PRIMARY KEY, Price decimal(12,2) NULL)")
    yield config(name)
    run(mssql_dsn, f"DROP TABLE IF EXISTS dbo.{name}")


@pytest.fixture
async def source(mssql_dsn: str) -> AsyncIterator[MssqlSource]:
    source = MssqlSource(SourceConfig(kind="mssql", dsn=mssql_dsn))
    await source.connect()
    yield source
    await source.close()


async def test_a_commit_wakes_the_table_within_a_second_and_idle_reads_wait(
    source: MssqlSource, table: TableConfig, mssql_dsn: str
) -> None:
    info = await tracked(source, table)
    _, bound = await changes(source, info, await source.current_version())
    await source.wait_for_changes(0.01)  # starts the watcher
    for _ in range(50):  # until a tick saw the bound (other tests may commit meanwhile)
        if source.quiet_for(info, bound) > 0:
            break
        _, bound = await changes(source, info, bound)
        await asyncio.sleep(0.1)
    assert source.quiet_for(info, bound) > 0
    loop = asyncio.get_running_loop()
    start = loop.time()
    run(mssql_dsn, f"INSERT INTO {table.table} (Id, Price) VALUES (1, 1.00)")
    woken = await source.wait_for_changes(10)
    assert table.table in woken and loop.time() - start < 1.0
    rows, _ = await changes(source, info, bound)
    assert [(r.op, r.key) for r in rows] == [("I", {"Id": 1})]


async def test_truncate_resets_the_tracking_start_and_a_caught_up_poller_sees_it(
    source: MssqlSource, table: TableConfig, mssql_dsn: str
) -> None:
    info = await tracked(source, table)
    run(mssql_dsn, f"INSERT INTO {table.table} (Id, Price) VALUES (1, 1.00)")
    _, bound = await changes(source, info, await source.current_version())
    run(mssql_dsn, f"TRUNCATE TABLE {table.table}")
    with pytest.raises((SchemaError, TrackingExpired)) as caught:
        await changes(source, info, bound)
    if isinstance(caught.value, SchemaError):
        assert "truncated" in str(caught.value)
    again = await source.describe(table)
    was, now = identity_parts(info.identity), identity_parts(again.identity)
    assert was["object"] == now["object"] and was["tracking since"] != now["tracking since"]
    reason = shape_change(info, again)
    assert reason is not None and reason.startswith("the table was truncated")


async def test_column_tracking_turned_on_between_polls(
    source: MssqlSource, table: TableConfig, mssql_dsn: str
) -> None:
    run(mssql_dsn, f"ALTER TABLE {table.table} ENABLE CHANGE_TRACKING WITH (TRACK_COLUMNS_UPDATED = OFF)")
    info = await source.describe(table)
    _, bound = await changes(source, info, await source.current_version())
    run(
        mssql_dsn,
        f"ALTER TABLE {table.table} DISABLE CHANGE_TRACKING",
        f"ALTER TABLE {table.table} ENABLE CHANGE_TRACKING WITH (TRACK_COLUMNS_UPDATED = ON)",
    )
    with pytest.raises((SchemaError, TrackingExpired)):
        await changes(source, info, bound)
    again = await source.describe(table)
    assert shape_change(info, again) is not None  # a snapshot follows
    version = [p async for p in source.snapshot(again, page_size=10)][0].version
    run(mssql_dsn, f"INSERT INTO {table.table} (Id, Price) VALUES (1, 1.00)")
    start = await source.current_version()
    run(mssql_dsn, f"UPDATE {table.table} SET Price = 2.00 WHERE Id = 1")
    rows, _ = await changes(source, again, max(start, version))
    assert [r.changed_columns for r in rows] == [frozenset({"Price"})]


def _database_dsn(dsn: str, database: str) -> str:
    parts = {k: v for k, v in parse_dsn(dsn).items() if k != "DATABASE"}
    quoted = {
        k: "{" + v.replace("}", "}}") + "}" if any(c in v for c in ";{}") else v for k, v in parts.items()
    }
    return ";".join(f"{k}={v}" for k, v in quoted.items()) + f";DATABASE={database}"


async def test_a_restore_changes_the_database_identity_and_the_next_read_says_so(mssql_dsn: str) -> None:
    """A database of its own, backed up, changed, restored WITH REPLACE from the
    earlier backup, then written past the old checkpoint: the version check
    alone would pass ("the data on the client and server are not synchronized")."""
    name = "CdcRestore_" + uuid.uuid4().hex[:8]
    master = _database_dsn(mssql_dsn, "master")
    try:
        run(master, f"CREATE DATABASE {name}")
    except pyodbc.Error as exc:
        pytest.skip(f"the test login may not CREATE DATABASE ({exc}): the restore test needs it")
    dsn = _database_dsn(mssql_dsn, name)
    backup = f"/var/opt/mssql/data/{name}.bak"
    try:
        run(
            master,
            f"ALTER DATABASE {name} SET ALLOW_SNAPSHOT_ISOLATION ON",
            f"ALTER DATABASE {name} SET CHANGE_TRACKING = ON (CHANGE_RETENTION = 1 DAYS, AUTO_CLEANUP = ON)",
        )
        run(
            dsn,
            "CREATE TABLE dbo.T (Id int NOT NULL PRIMARY KEY, V int NULL)",
            "ALTER TABLE dbo.T ENABLE CHANGE_TRACKING WITH (TRACK_COLUMNS_UPDATED = ON)",
            "INSERT INTO dbo.T (Id, V) VALUES (1, 1)",
        )
        run(master, f"BACKUP DATABASE {name} TO DISK = N'{backup}' WITH INIT")
        source = MssqlSource(SourceConfig(kind="mssql", dsn=dsn))
        await source.connect()
        try:
            info = await source.describe(config("T"))
            for i in range(2, 6):
                run(dsn, f"INSERT INTO dbo.T (Id, V) VALUES ({i}, {i})")
            _, checkpoint = await changes(source, info, await source.current_version() - 4)
            await source.close()
            run(
                master,
                f"ALTER DATABASE {name} SET SINGLE_USER WITH ROLLBACK IMMEDIATE",
                f"RESTORE DATABASE {name} FROM DISK = N'{backup}' WITH REPLACE",
                f"ALTER DATABASE {name} SET MULTI_USER",
            )
            for i in range(10, 20):  # past the old checkpoint again
                run(dsn, f"INSERT INTO dbo.T (Id, V) VALUES ({i}, {i})")
            assert scalar(dsn, "SELECT CHANGE_TRACKING_CURRENT_VERSION()") >= checkpoint
            source = MssqlSource(SourceConfig(kind="mssql", dsn=dsn))
            await source.connect()
            with pytest.raises(SchemaError, match="the database was restored"):
                await source.read_changes(info, checkpoint, limit=100)
            reason = shape_change(info, await source.describe(config("T")))
            assert reason is not None and reason.startswith("the database was restored")
        finally:
            await source.close()
    finally:
        run(master, f"ALTER DATABASE {name} SET SINGLE_USER WITH ROLLBACK IMMEDIATE", f"DROP DATABASE {name}")
