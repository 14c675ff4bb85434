"""The SQL Server source against a real SQL Server (``mssql_dsn``).

These run wherever a SQL Server is reachable: CDC_TEST_MSSQL_DSN (a database
in which the login may ALTER DATABASE and create tables), or a SQL Server 2022
container when a Docker engine answers. Otherwise they are skipped with the
reason, even under CI=true: no SQL Server can run on the project's machines,
so none of this has been run there yet.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import AsyncIterator, Iterator
from decimal import Decimal
from typing import Any

import pyodbc
import pytest

from cdc.config import SourceConfig, TableConfig
from cdc.errors import TrackingExpired
from cdc.sources.base import ChangeRow, TableInfo
from cdc.sources.mssql import MssqlSource
from cdc.templates import Template
from cdc.values import encode_value

pytestmark = pytest.mark.mssql


def run(dsn: str, *statements: str, params: tuple[Any, ...] = ()) -> None:
    conn = pyodbc.connect(dsn, autocommit=True, timeout=30)
    try:
        for statement in statements:
            conn.execute(statement, *params)
    finally:
        conn.close()


@pytest.fixture
def table(mssql_dsn: str) -> Iterator[TableConfig]:
    """A fresh dbo.Forecasts_<random> with a computed column, dropped afterwards."""
    name = "Forecasts_" + uuid.uuid4().hex[:8]
    run(
        mssql_dsn,
        f"CREATE TABLE dbo.{name} (Id int NOT NULL PRIMARY KEY, Price decimal(12,2) NULL, "
        "Status nvarchar(20) NULL, Doubled AS (Id * 2))",
    )
    yield TableConfig(
        table=f"dbo.{name}",
        schema="dbo",
        name=name,
        section=name.lower(),
        partition=Template.parse("app1"),
        key=None,
        columns=None,
    )
    run(mssql_dsn, f"DROP TABLE IF EXISTS dbo.{name}")


@pytest.fixture
async def source(mssql_dsn: str) -> AsyncIterator[MssqlSource]:
    source = MssqlSource(SourceConfig(kind="mssql", dsn=mssql_dsn))
    await source.connect()
    yield source
    await source.close()


async def tracked(source: MssqlSource, table: TableConfig) -> TableInfo:
    await source.tracking_enable([table])
    return await source.describe(table)


async def changes(
    source: MssqlSource, info: TableInfo, since: int, limit: int = 1000
) -> tuple[list[ChangeRow], int]:
    rows: list[ChangeRow] = []
    page = await source.read_changes(info, since, limit=limit)
    rows += page.rows
    while page.more:
        page = await source.read_changes(info, since, limit=limit, upto=page.next_version, after=page.cursor)
        rows += page.rows
    return rows, page.next_version


async def test_enable_describe_and_status(source: MssqlSource, table: TableConfig) -> None:
    done = await source.tracking_enable([table])
    assert any("change tracking enabled" in line for line in done)
    info = await source.describe(table)
    assert info.primary_key == ("Id",)
    assert [(c.name, c.type_name) for c in info.columns] == [
        ("Id", "int"),
        ("Price", "decimal(12,2)"),
        ("Status", "nvarchar(20)"),
        ("Doubled", "int"),
    ]
    [status] = await source.tracking_status([table])
    assert status.enabled and "TRACK_COLUMNS_UPDATED = ON" in status.detail
    assert await source.tracking_enable([table])  # idempotent
    findings = await source.doctor([table])
    assert not [f for f in findings if f.level == "error"], findings


async def test_net_operations(source: MssqlSource, table: TableConfig, mssql_dsn: str) -> None:
    info = await tracked(source, table)
    start = await source.current_version()
    t = table.table
    run(
        mssql_dsn,
        f"INSERT INTO {t} (Id, Price, Status) VALUES (1, 1.50, 'a'), (2, 2.50, 'b'), (3, 3.50, 'c')",
    )
    rows, checkpoint = await changes(source, info, start)
    assert [(r.op, r.key["Id"]) for r in rows] == [("I", 1), ("I", 2), ("I", 3)]
    assert rows[0].values == {"Id": 1, "Price": Decimal("1.50"), "Status": "a", "Doubled": 2}
    run(
        mssql_dsn,
        f"UPDATE {t} SET Status = 'z' WHERE Id = 1",
        f"DELETE FROM {t} WHERE Id = 2",
        f"DELETE FROM {t} WHERE Id = 3",
        f"INSERT INTO {t} (Id, Price, Status) VALUES (3, 9.00, 'again')",  # delete + re-insert: U
        f"INSERT INTO {t} (Id, Price, Status) VALUES (4, 4.00, 'd')",
        f"UPDATE {t} SET Price = 4.25 WHERE Id = 4",  # insert + update: I
    )
    rows, later = await changes(source, info, checkpoint)
    ops = {r.key["Id"]: r.op for r in rows}
    assert ops == {1: "U", 2: "D", 3: "U", 4: "I"}
    assert next(r for r in rows if r.key["Id"] == 2).values is None
    assert next(r for r in rows if r.key["Id"] == 4).values == {
        "Id": 4,
        "Price": Decimal("4.25"),
        "Status": "d",
        "Doubled": 8,
    }
    assert later >= checkpoint
    idle, idle_version = await changes(source, info, later)
    assert idle == [] and idle_version >= later


async def test_primary_key_update_is_delete_plus_insert(
    source: MssqlSource, table: TableConfig, mssql_dsn: str
) -> None:
    info = await tracked(source, table)
    run(mssql_dsn, f"INSERT INTO {table.table} (Id, Price, Status) VALUES (1, 1.00, 'a')")
    since = await source.current_version()
    run(mssql_dsn, f"UPDATE {table.table} SET Id = 10 WHERE Id = 1")
    rows, _ = await changes(source, info, since)
    assert sorted((r.op, r.key["Id"]) for r in rows) == [("D", 1), ("I", 10)]


async def test_changed_columns(source: MssqlSource, table: TableConfig, mssql_dsn: str) -> None:
    info = await tracked(source, table)
    run(mssql_dsn, f"INSERT INTO {table.table} (Id, Price, Status) VALUES (1, 1.00, 'a'), (2, 2.00, 'b')")
    since = await source.current_version()
    run(
        mssql_dsn,
        f"UPDATE {table.table} SET Price = 1.10 WHERE Id = 1",
        f"UPDATE {table.table} SET Price = 2.20, Status = 'bb' WHERE Id = 2",  # every non-key column
    )
    rows, _ = await changes(source, info, since)
    by_id = {r.key["Id"]: r for r in rows}
    assert by_id[1].changed_columns == frozenset({"Price", "Doubled"})  # computed: always counted
    # all non-key columns changed: SQL Server may hand over a NULL mask, which means unknown
    assert by_id[2].changed_columns in (None, frozenset({"Price", "Status", "Doubled"}))


async def test_snapshot_and_its_version(source: MssqlSource, table: TableConfig, mssql_dsn: str) -> None:
    info = await tracked(source, table)
    values = ", ".join(f"({i}, {i}.00, 's{i}')" for i in range(1, 6))
    run(mssql_dsn, f"INSERT INTO {table.table} (Id, Price, Status) VALUES {values}")
    before = await source.current_version()
    pages = [page async for page in source.snapshot(info, page_size=2)]
    assert [len(p.rows) for p in pages] == [2, 2, 1]
    version = pages[0].version
    assert {p.version for p in pages} == {version} and version >= before
    assert [r["Id"] for p in pages for r in p.rows] == [1, 2, 3, 4, 5]
    run(mssql_dsn, f"UPDATE {table.table} SET Status = 'after' WHERE Id = 5")
    rows, _ = await changes(source, info, version)
    assert [(r.op, r.key["Id"], r.values and r.values["Status"]) for r in rows] == [("U", 5, "after")]


async def test_paging_covers_everything_once(source: MssqlSource, table: TableConfig, mssql_dsn: str) -> None:
    info = await tracked(source, table)
    since = await source.current_version()
    for i in range(1, 8):
        run(mssql_dsn, f"INSERT INTO {table.table} (Id, Price, Status) VALUES ({i}, 1.00, 'x')")
    rows, _ = await changes(source, info, since, limit=3)
    assert [r.key["Id"] for r in rows] == list(range(1, 8))


async def test_a_since_above_the_current_version_is_expired(source: MssqlSource, table: TableConfig) -> None:
    info = await tracked(source, table)
    current = await source.current_version()
    with pytest.raises(TrackingExpired, match="restored"):
        await source.read_changes(info, current + 1000, limit=10)


async def test_truncate_expires_the_checkpoint(
    source: MssqlSource, table: TableConfig, mssql_dsn: str
) -> None:
    info = await tracked(source, table)
    run(mssql_dsn, f"INSERT INTO {table.table} (Id, Price, Status) VALUES (1, 1.00, 'a')")
    since = await source.current_version()
    run(
        mssql_dsn,
        f"INSERT INTO {table.table} (Id, Price, Status) VALUES (2, 1.00, 'a')",
        f"TRUNCATE TABLE {table.table}",
    )
    with pytest.raises(TrackingExpired, match="minimum valid version"):
        await source.read_changes(info, since, limit=10)


async def test_type_round_trip(source: MssqlSource, mssql_dsn: str) -> None:
    name = "Types_" + uuid.uuid4().hex[:8]
    run(
        mssql_dsn,
        f"CREATE TABLE dbo.{name} (Id uniqueidentifier NOT NULL PRIMARY KEY, Dec decimal(18,4), Num numeric(5,0), "
        "Mon money, SMon smallmoney, Dt datetime, Dt2 datetime2(7), SDt smalldatetime, Dto datetimeoffset(7), "
        "D date, Tm time(7), Bin binary(3), VBin varbinary(max), Img image, Rv rowversion, C char(3), "
        "VC varchar(10), NC nchar(2), NVC nvarchar(max), Txt text, NTxt ntext, B bit, TI tinyint, SI smallint, "
        "I int, BI bigint, F float, R real, X xml)",
    )
    table = TableConfig(
        table=f"dbo.{name}",
        schema="dbo",
        name=name,
        section=name.lower(),
        partition=Template.parse("p"),
        key=None,
        columns=None,
    )
    try:
        run(
            mssql_dsn,
            f"INSERT INTO dbo.{name} (Id, Dec, Num, Mon, SMon, Dt, Dt2, SDt, Dto, D, Tm, Bin, VBin, Img, C, VC, NC, "
            "NVC, Txt, NTxt, B, TI, SI, I, BI, F, R, X) VALUES ('6F9619FF-8B86-D011-B42D-00C04FC964FF', 12.5, 42, "
            "12.5, 1.25, '2026-11-21T23:00:00.123', '2026-11-21T23:00:00.1234567', '2026-11-21T23:00:00', "
            "'2026-11-21T23:00:00.1234567+02:00', '2026-11-21', '23:59:59.1234567', 0x0001FF, 0xCAFE, 0xBEEF, "
            "'abc', 'héllo', N'ü', N'ünïcode', 'text', N'ntext', 1, 255, -32768, 2147483647, "
            "9223372036854775807, 0.1, 1.1, '<a b=\"1\"/>')",
        )
        info = await tracked(source, table)
        [page] = [p async for p in source.snapshot(info, page_size=10)]
        [row] = page.rows
        assert row["Id"] == "6f9619ff-8b86-d011-b42d-00c04fc964ff"
        assert row["Dec"] == Decimal("12.5000") and encode_value(row["Dec"]) == b'"12.5000"'
        assert (
            row["Num"] == Decimal("42")
            and row["Mon"] == Decimal("12.5000")
            and row["SMon"] == Decimal("1.2500")
        )
        assert row["Dt"] == dt.datetime(2026, 11, 21, 23, 0, 0, 123000)
        assert row["Dt2"] == dt.datetime(2026, 11, 21, 23, 0, 0, 123456)  # the 7th digit is truncated
        assert row["SDt"] == dt.datetime(2026, 11, 21, 23, 0)
        assert row["Dto"] == dt.datetime(
            2026, 11, 21, 23, 0, 0, 123456, tzinfo=dt.timezone(dt.timedelta(hours=2))
        )
        assert row["D"] == dt.date(2026, 11, 21) and row["Tm"] == dt.time(23, 59, 59, 123456)
        assert row["Bin"] == b"\x00\x01\xff" and row["VBin"] == b"\xca\xfe" and row["Img"] == b"\xbe\xef"
        assert isinstance(row["Rv"], bytes) and len(row["Rv"]) == 8
        assert (row["C"], row["VC"], row["NC"], row["NVC"]) == ("abc", "héllo", "ü ", "ünïcode")
        assert (row["Txt"], row["NTxt"]) == ("text", "ntext")
        assert row["B"] is True and (row["TI"], row["SI"], row["I"]) == (255, -32768, 2147483647)
        assert row["BI"] == 9223372036854775807 and row["F"] == 0.1 and row["R"] == 1.1
        assert row["X"] == '<a b="1"/>'
        for column, value in row.items():
            encode_value(value, column)  # every value has a JSON form
    finally:
        run(mssql_dsn, f"DROP TABLE IF EXISTS dbo.{name}")
