"""The SQL Server source against a real SQL Server (``mssql_dsn``).

These run wherever a SQL Server is reachable: CDC_TEST_MSSQL_DSN (a database
in which the login may ALTER DATABASE, create tables and logins), or a SQL
Server 2022 container when a Docker engine answers; once per installed ODBC
driver (FreeTDS, Microsoft ODBC Driver 18). Otherwise they are skipped with
the reason, even under CI=true (a failure under `make test-mssql`): no SQL
Server can run on the project's machines, so none of this has been run there
yet.

The source under test connects as a least-privileged login (``mssql_reader``:
SELECT and VIEW CHANGE TRACKING on the tables it is given, SQLSERVER.md §2),
never as the administrator: setting tracking up, which needs ALTER, goes
through the administrator's source (``LeastPrivilegeSource``).

The last section takes a table through one DDL step per test (ADD COLUMN with
and without a DEFAULT, DROP COLUMN, DROP + ADD of a column under its name,
sp_rename of a column, ALTER COLUMN to another type, sp_rename of the table
and back, DROP TABLE, DROP + CREATE + `cdc tracking enable`, tracking
disabled and enabled again) and checks what the sidecar relies on at each.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from decimal import Decimal
from typing import Any

import pyodbc
import pytest

from cdc.config import SourceConfig, TableConfig
from cdc.errors import SchemaError, TrackingExpired, TrackingNotEnabled
from cdc.sources.base import ChangeRow, TableInfo, TrackingStatus
from cdc.sources.mssql import MssqlSource
from cdc.templates import Template
from cdc.values import encode_value
from tests.e2e import wait_for
from tests.mssql_env import Endpoint, LeastPrivilegeLogin

pytestmark = pytest.mark.mssql


def run(dsn: str, *statements: str, params: tuple[Any, ...] = ()) -> None:
    conn = pyodbc.connect(dsn, autocommit=True, timeout=30)
    try:
        for statement in statements:
            conn.execute(statement, *params)
    finally:
        conn.close()


def scalar(dsn: str, statement: str) -> Any:
    conn = pyodbc.connect(dsn, autocommit=True, timeout=30)
    try:
        return conn.execute(statement).fetchone()[0]
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


class LeastPrivilegeSource(MssqlSource):
    """The source under test, connected as ``reader``. Enabling and disabling
    tracking (ALTER DATABASE, ALTER TABLE) go through ``admin``, and a table
    enabled is granted to the reader: what an operator does once."""

    def __init__(self, reader: LeastPrivilegeLogin, admin: MssqlSource) -> None:
        super().__init__(SourceConfig(kind="mssql", dsn=reader.dsn))
        self.reader = reader
        self.admin = admin

    async def tracking_enable(self, tables: Sequence[TableConfig]) -> list[str]:
        done = await self.admin.tracking_enable(tables)
        for table in tables:
            self.reader.grant(table.table)
        return done

    async def tracking_disable(self, tables: Sequence[TableConfig]) -> list[str]:
        return await self.admin.tracking_disable(tables)


@pytest.fixture
async def admin(mssql_dsn: str) -> AsyncIterator[MssqlSource]:
    source = MssqlSource(SourceConfig(kind="mssql", dsn=mssql_dsn))
    await source.connect()
    yield source
    await source.close()


@pytest.fixture
async def source(
    mssql_reader: LeastPrivilegeLogin, admin: MssqlSource
) -> AsyncIterator[LeastPrivilegeSource]:
    source = LeastPrivilegeSource(mssql_reader, admin)
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


async def test_keys_swapped_by_one_update_are_both_published(
    source: MssqlSource, table: TableConfig, mssql_dsn: str
) -> None:
    """One UPDATE swapping two keys: Change Tracking records each key's update
    as a delete and an insert; whatever operation it reports, both rows exist
    and both are published with their values, never as deletes."""
    info = await tracked(source, table)
    run(mssql_dsn, f"INSERT INTO {table.table} (Id, Price, Status) VALUES (1, 1.00, 'one'), (2, 2.00, 'two')")
    since = await source.current_version()
    run(mssql_dsn, f"UPDATE {table.table} SET Id = 3 - Id")
    rows, _ = await changes(source, info, since)
    assert sorted((r.key["Id"], r.op != "D", r.values and r.values["Status"]) for r in rows) == [
        (1, True, "two"),
        (2, True, "one"),
    ]


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
        "I int, BI bigint, F float, R real, X xml, H hierarchyid, G geometry, Geo geography, V sql_variant)",
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
            "NVC, Txt, NTxt, B, TI, SI, I, BI, F, R, X, H, G, Geo, V) VALUES ('6F9619FF-8B86-D011-B42D-00C04FC964FF', "
            "12.5, 42, "
            "12.5, 1.25, '2026-11-21T23:00:00.123', '2026-11-21T23:00:00.1234567', '2026-11-21T23:00:00', "
            "'2026-11-21T23:00:00.1234567+02:00', '2026-11-21', '23:59:59.1234567', 0x0001FF, 0xCAFE, 0xBEEF, "
            "'abc', 'héllo', N'ü', N'ünïcode', 'text', N'ntext', 1, 255, -32768, 2147483647, "
            "9223372036854775807, 0.1, 1.1, '<a b=\"1\"/>', '/1/2/', geometry::STGeomFromText('POINT(1 2 3 4)', 0), "
            "geography::Point(47.651, -122.349, 4326), CAST(12.50 AS decimal(10,2)))",
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
        assert row["Dt"] == "2026-11-21T23:00:00.123000"
        assert row["Dt2"] == "2026-11-21T23:00:00.1234567"  # every digit: 100 ns
        assert row["SDt"] == "2026-11-21T23:00:00"
        assert row["Dto"] == "2026-11-21T23:00:00.1234567+02:00"
        assert row["D"] == dt.date(2026, 11, 21) and row["Tm"] == "23:59:59.1234567"
        assert row["H"] == "/1/2/"
        serialized = scalar(mssql_dsn, f"SELECT CAST(G AS varbinary(max)) FROM dbo.{name}")
        assert row["G"] == serialized and row["G"][:4] == (0).to_bytes(4, "little")  # [MS-SSCLRT]: SRID first
        assert row["Geo"][:4] == (4326).to_bytes(4, "little")
        assert (
            scalar(mssql_dsn, f"SELECT CAST(0x{row['G'].hex()} AS geometry).AsTextZM()") == "POINT (1 2 3 4)"
        )
        assert row["V"] == {"type": "decimal", "value": Decimal("12.50")}
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


def config_of(name: str) -> TableConfig:
    return TableConfig(
        table=f"dbo.{name}",
        schema="dbo",
        name=name,
        section=name.lower(),
        partition=Template.parse("p"),
        key=None,
        columns=None,
    )


VARIANTS = [  # (T-SQL value, the JSON the mirror holds)
    ("CAST(5 AS int)", '{"type":"int","value":5}'),
    ("CAST(9223372036854775807 AS bigint)", '{"type":"bigint","value":9223372036854775807}'),
    ("CAST(1 AS bit)", '{"type":"bit","value":true}'),
    ("CAST(12.50 AS decimal(10,2))", '{"type":"decimal","value":"12.50"}'),
    ("CAST(-1.2345 AS money)", '{"type":"money","value":"-1.2345"}'),
    ("CAST(0.1 AS float)", '{"type":"float","value":0.1}'),
    ("CAST(1.1 AS real)", '{"type":"real","value":1.1}'),
    ("CAST(N'5' AS nvarchar(10))", '{"type":"nvarchar","value":"5"}'),
    ("CAST('hé' AS varchar(10))", '{"type":"varchar","value":"hé"}'),
    ("CAST(0x00FF AS varbinary(10))", '{"type":"varbinary","value":"AP8="}'),
    ("CAST('2026-11-21' AS date)", '{"type":"date","value":"2026-11-21"}'),
    (
        "CAST('2026-11-21T23:00:00.1234567' AS datetime2(7))",
        '{"type":"datetime2","value":"2026-11-21T23:00:00.1234567"}',
    ),
    ("CAST('23:59:59.5' AS time(3))", '{"type":"time","value":"23:59:59.500000"}'),
    (
        "CAST('2026-11-21T23:00:00.1+02:00' AS datetimeoffset(1))",
        '{"type":"datetimeoffset","value":"2026-11-21T23:00:00.100000+02:00"}',
    ),
    (
        "CAST('6F9619FF-8B86-D011-B42D-00C04FC964FF' AS uniqueidentifier)",
        '{"type":"uniqueidentifier","value":"6f9619ff-8b86-d011-b42d-00c04fc964ff"}',
    ),
]


async def test_sql_variant_values_carry_their_base_type(source: MssqlSource, mssql_dsn: str) -> None:
    name = "Variants_" + uuid.uuid4().hex[:8]
    run(mssql_dsn, f"CREATE TABLE dbo.{name} (Id int NOT NULL PRIMARY KEY, V sql_variant)")
    try:
        for i, (value, _) in enumerate([*VARIANTS, ("NULL", "null")]):
            run(mssql_dsn, f"INSERT INTO dbo.{name} VALUES ({i}, {value})")
        info = await tracked(source, config_of(name))
        rows = await snapshot_rows(source, info)
        assert [encode_value(r["V"], "V").decode() for r in rows] == [j for _, j in VARIANTS] + ["null"]
    finally:
        run(mssql_dsn, f"DROP TABLE IF EXISTS dbo.{name}")


async def test_keys_below_a_microsecond_are_documents_of_their_own(
    source: MssqlSource, mssql_dsn: str
) -> None:
    """Issue 14 item 1: datetime2(7) keys 100 ns apart are rows of their own, so
    documents of their own, and pages of rows sharing one microsecond page on."""
    name = "Ticks_" + uuid.uuid4().hex[:8]
    run(mssql_dsn, f"CREATE TABLE dbo.{name} (Ts datetime2(7) NOT NULL PRIMARY KEY, N int)")
    try:
        for tick in range(5):
            run(mssql_dsn, f"INSERT INTO dbo.{name} VALUES ('2026-11-21T23:00:00.123456{tick}', {tick})")
        info = await tracked(source, config_of(name))
        rows = [row async for page in source.snapshot(info, page_size=2) for row in page.rows]
        keys = [Template.join(info.primary_key).render(row) for row in rows]
        assert keys == [
            "2026-11-21T23:00:00.123456",
            *(f"2026-11-21T23:00:00.123456{tick}" for tick in range(1, 5)),
        ]
    finally:
        run(mssql_dsn, f"DROP TABLE IF EXISTS dbo.{name}")


# -- the table changes shape: one DDL step per test, as the sidecar meets it ------------------------
#
# Each step checks what the sidecar relies on: the fingerprint poll notices it,
# describe gives the TableInfo now, reads with that info work (and reads with
# the old one fail with an error of the table, never a crash), and tracking
# status says whether changes are still captured. What SQL Server does itself
# is asserted too, where the sidecar's design depends on it ("Manage change
# tracking", learn.microsoft.com): ADD COLUMN and ALTER COLUMN mark no row as
# changed, DROP TABLE drops the table's tracking, enabling tracking again sets
# the minimum valid version to that moment.


async def described_again(source: MssqlSource, table: TableConfig, before: TableInfo) -> TableInfo:
    """The fingerprint differs from ``before``'s; describe gives the table as it is now."""
    now = (await source.fingerprints([table]))[table.table]
    assert now is not None and now != before.fingerprint
    info = await source.describe(table)
    assert info.fingerprint == now
    return info


async def snapshot_rows(source: MssqlSource, info: TableInfo) -> list[dict[str, Any]]:
    return [row async for page in source.snapshot(info, page_size=100) for row in page.rows]


async def status_of(source: MssqlSource, table: TableConfig) -> TrackingStatus:
    [status] = await source.tracking_status([table])
    return status


async def test_add_column_is_described_and_marks_no_existing_row(
    source: MssqlSource, table: TableConfig, mssql_dsn: str
) -> None:
    info = await tracked(source, table)
    t = table.table
    run(mssql_dsn, f"INSERT INTO {t} (Id, Price, Status) VALUES (1, 1.50, 'a'), (2, 2.50, 'b')")
    since = await source.current_version()
    run(
        mssql_dsn,
        f"ALTER TABLE {t} ADD D int NULL",
        f"ALTER TABLE {t} ADD E nvarchar(10) NOT NULL CONSTRAINT DF_{table.name}_E DEFAULT N'dflt'",
        f"ALTER TABLE {t} ADD [@flag] bit NULL",
    )
    added = await described_again(source, table, info)
    assert [(c.name, c.type_name) for c in added.columns[-2:]] == [("D", "int"), ("E", "nvarchar(10)")]
    assert added.identity == info.identity and added.left_out == ("@flag",)
    rows, _ = await changes(source, added, since)
    assert rows == []  # no existing row is marked: only a snapshot brings D and E to the documents
    assert [(r["Id"], r["D"], r["E"]) for r in await snapshot_rows(source, added)] == [
        (1, None, "dflt"),
        (2, None, "dflt"),
    ]
    run(mssql_dsn, f"UPDATE {t} SET D = 5 WHERE Id = 1")
    [row], _ = await changes(source, added, since)
    assert row.values is not None and (row.values["D"], row.values["E"]) == (5, "dflt")
    assert row.changed_columns == frozenset({"D", "Doubled"})  # the new column's id, looked up by name
    status = await status_of(source, table)
    assert status.enabled and status.min_valid_version is not None and status.min_valid_version <= since


async def test_drop_column_fails_the_old_reads_and_the_new_ones_work(
    source: MssqlSource, table: TableConfig, mssql_dsn: str
) -> None:
    info = await tracked(source, table)
    run(mssql_dsn, f"INSERT INTO {table.table} (Id, Price, Status) VALUES (1, 1.50, 'a')")
    since = await source.current_version()
    run(mssql_dsn, f"ALTER TABLE {table.table} DROP COLUMN Status")
    with pytest.raises(SchemaError, match="described again"):
        await source.read_changes(info, since, limit=10)
    dropped = await described_again(source, table, info)
    assert dropped.column_names == ("Id", "Price", "Doubled")
    run(mssql_dsn, f"UPDATE {table.table} SET Price = 2.00 WHERE Id = 1")
    [row], _ = await changes(source, dropped, since)
    assert row.values == {"Id": 1, "Price": Decimal("2.00"), "Doubled": 2}
    assert await snapshot_rows(source, dropped) == [{"Id": 1, "Price": Decimal("2.00"), "Doubled": 2}]


async def test_a_column_dropped_and_added_again_has_a_new_id_and_masks_follow_it(
    source: MssqlSource, table: TableConfig, mssql_dsn: str
) -> None:
    """CHANGE_TRACKING_IS_COLUMN_IN_MASK takes the column id COLUMNPROPERTY
    gives; after DROP + ADD the name has a new one, which the reads look up."""
    info = await tracked(source, table)
    run(mssql_dsn, f"INSERT INTO {table.table} (Id, Price, Status) VALUES (1, 1.50, 'a')")
    column_id = f"SELECT COLUMNPROPERTY(OBJECT_ID(N'{table.table}'), N'Price', 'ColumnId')"
    before = scalar(mssql_dsn, column_id)
    run(
        mssql_dsn,
        f"ALTER TABLE {table.table} DROP COLUMN Price",
        f"ALTER TABLE {table.table} ADD Price decimal(12,2) NULL",
    )
    assert scalar(mssql_dsn, column_id) != before
    again = await described_again(source, table, info)
    assert again.column_names == ("Id", "Status", "Doubled", "Price")
    since = await source.current_version()
    run(mssql_dsn, f"UPDATE {table.table} SET Status = 'b' WHERE Id = 1")
    [row], _ = await changes(source, again, since)
    assert row.changed_columns == frozenset({"Status", "Doubled"})
    since = await source.current_version()
    run(mssql_dsn, f"UPDATE {table.table} SET Price = 3.00 WHERE Id = 1")
    [row], _ = await changes(source, again, since)
    assert row.changed_columns == frozenset({"Price", "Doubled"})


async def test_rename_column_fails_the_old_reads_and_the_new_ones_work(
    source: MssqlSource, table: TableConfig, mssql_dsn: str
) -> None:
    info = await tracked(source, table)
    run(mssql_dsn, f"INSERT INTO {table.table} (Id, Price, Status) VALUES (1, 1.50, 'a')")
    since = await source.current_version()
    run(mssql_dsn, f"EXEC sp_rename N'{table.table}.Status', N'State', 'COLUMN'")
    with pytest.raises(SchemaError, match="described again"):
        await source.read_changes(info, since, limit=10)
    renamed = await described_again(source, table, info)
    assert renamed.column_names == ("Id", "Price", "State", "Doubled")
    run(mssql_dsn, f"UPDATE {table.table} SET State = 'b' WHERE Id = 1")
    [row], _ = await changes(source, renamed, since)
    assert row.values is not None and row.values["State"] == "b"
    assert row.changed_columns == frozenset({"State", "Doubled"})


async def test_alter_column_type_is_described_and_marks_no_row(
    source: MssqlSource, table: TableConfig, mssql_dsn: str
) -> None:
    info = await tracked(source, table)
    run(mssql_dsn, f"INSERT INTO {table.table} (Id, Price, Status) VALUES (1, 1.50, 'a')")
    since = await source.current_version()
    run(mssql_dsn, f"ALTER TABLE {table.table} ALTER COLUMN Price nvarchar(20) NULL")
    retyped = await described_again(source, table, info)
    assert [(c.name, c.type_name) for c in retyped.columns][1] == ("Price", "nvarchar(20)")
    rows, _ = await changes(source, retyped, since)
    assert rows == []  # a type change is not tracked: only a snapshot brings the new values
    assert await snapshot_rows(source, retyped) == [{"Id": 1, "Price": "1.50", "Status": "a", "Doubled": 2}]
    run(mssql_dsn, f"UPDATE {table.table} SET Price = N'cheap' WHERE Id = 1")
    [row], _ = await changes(source, retyped, since)
    assert row.values is not None and row.values["Price"] == "cheap"


async def test_rename_table_and_back(source: MssqlSource, table: TableConfig, mssql_dsn: str) -> None:
    """The name leads nowhere while renamed; renamed back, it is the same object,
    whose tracking followed it, so the checkpoint still holds."""
    info = await tracked(source, table)
    since = await source.current_version()
    moved = f"{table.name}_moved"
    run(mssql_dsn, f"EXEC sp_rename N'{table.table}', N'{moved}'")
    assert await source.fingerprints([table]) == {table.table: None}
    with pytest.raises(SchemaError, match="described again"):
        await source.read_changes(info, since, limit=10)
    with pytest.raises(SchemaError, match="no such table"):
        await source.describe(table)
    status = await status_of(source, table)
    assert (status.enabled, status.min_valid_version) == (False, None) and "no such table" in status.detail
    run(mssql_dsn, f"INSERT INTO dbo.{moved} (Id, Price, Status) VALUES (7, 7.00, 'while moved')")
    run(mssql_dsn, f"EXEC sp_rename N'dbo.{moved}', N'{table.name}'")
    assert (await source.fingerprints([table]))[table.table] == info.fingerprint
    back = await source.describe(table)
    assert back == info
    [row], _ = await changes(source, back, since)
    assert (row.op, row.key) == ("I", {"Id": 7})


async def test_drop_table(source: MssqlSource, table: TableConfig, mssql_dsn: str) -> None:
    info = await tracked(source, table)
    since = await source.current_version()
    run(mssql_dsn, f"DROP TABLE {table.table}")
    assert await source.fingerprints([table]) == {table.table: None}
    with pytest.raises(SchemaError, match="described again"):
        await source.read_changes(info, since, limit=10)
    with pytest.raises(SchemaError, match="no such table"):
        await source.describe(table)
    status = await status_of(source, table)
    assert (status.enabled, status.min_valid_version) == (False, None)


async def test_drop_create_and_enable_again(
    source: LeastPrivilegeSource, table: TableConfig, mssql_dsn: str
) -> None:
    """DROP TABLE removes the table's tracking: created again, it is another
    object, not tracked until `cdc tracking enable`; then its minimum valid
    version is the version of that moment, so an old checkpoint has expired."""
    info = await tracked(source, table)
    run(mssql_dsn, f"INSERT INTO {table.table} (Id, Price, Status) VALUES (1, 1.00, 'a')")
    checkpoint = await source.current_version()
    run(mssql_dsn, f"INSERT INTO {table.table} (Id, Price, Status) VALUES (2, 2.00, 'b')")  # above it
    run(
        mssql_dsn,
        f"DROP TABLE {table.table}",
        f"CREATE TABLE {table.table} (Id int NOT NULL PRIMARY KEY, Price decimal(12,2) NULL, "
        "Status nvarchar(20) NULL, Doubled AS (Id * 2))",
        f"INSERT INTO {table.table} (Id, Price, Status) VALUES (3, 3.00, 'new')",
    )
    source.reader.grant(table.table)  # a new object: the old one's permissions went with it
    created = await described_again(source, table, info)
    assert created.identity != info.identity and created.column_names == info.column_names
    with pytest.raises(SchemaError, match="dropped and created again"):
        await source.read_changes(info, checkpoint, limit=10)
    with pytest.raises(TrackingNotEnabled, match=f"`cdc tracking enable --table {table.table}`"):
        await source.read_changes(created, checkpoint, limit=10)
    status = await status_of(source, table)
    assert (status.enabled, status.min_valid_version) == (False, None)
    assert f"`cdc tracking enable --table {table.table}`" in status.detail
    await source.tracking_enable([table])
    status = await status_of(source, table)
    assert status.enabled and status.min_valid_version is not None and status.min_valid_version > checkpoint
    enabled = await described_again(source, table, created)
    assert enabled == created  # the same object and columns: only its tracking changed
    with pytest.raises(TrackingExpired, match="minimum valid version"):
        await source.read_changes(enabled, checkpoint, limit=10)
    pages = [page async for page in source.snapshot(enabled, page_size=100)]
    assert [r["Id"] for p in pages for r in p.rows] == [3]
    run(mssql_dsn, f"UPDATE {table.table} SET Status = 'changed' WHERE Id = 3")
    [row], _ = await changes(source, enabled, pages[0].version)
    assert (row.op, row.key, row.values and row.values["Status"]) == ("U", {"Id": 3}, "changed")


async def test_tracking_disabled_and_enabled_again(
    source: MssqlSource, table: TableConfig, mssql_dsn: str
) -> None:
    info = await tracked(source, table)
    run(mssql_dsn, f"INSERT INTO {table.table} (Id, Price, Status) VALUES (1, 1.00, 'a')")
    checkpoint = await source.current_version()
    run(mssql_dsn, f"INSERT INTO {table.table} (Id, Price, Status) VALUES (2, 2.00, 'b')")  # above it
    await source.tracking_disable([table])
    off = await described_again(source, table, info)
    assert off == info  # the same table; only its tracking is off
    with pytest.raises(TrackingNotEnabled, match=f"`cdc tracking enable --table {table.table}`"):
        await source.read_changes(off, checkpoint, limit=10)
    status = await status_of(source, table)
    assert (status.enabled, status.min_valid_version) == (False, None)
    run(mssql_dsn, f"UPDATE {table.table} SET Status = 'unseen' WHERE Id = 1")  # not tracked
    await source.tracking_enable([table])
    on = await described_again(source, table, off)
    assert on == info and on.fingerprint == info.fingerprint
    status = await status_of(source, table)
    assert status.enabled and status.min_valid_version is not None and status.min_valid_version > checkpoint
    with pytest.raises(TrackingExpired, match="minimum valid version"):
        await source.read_changes(on, checkpoint, limit=10)
    rows = await snapshot_rows(source, on)
    assert [(r["Id"], r["Status"]) for r in rows] == [(1, "unseen"), (2, "b")]


# -- permissions and set-up (issue 14 items 9 and 12) --------------------------------------------


async def test_doctor_accepts_column_level_select_and_names_a_column_without_it(
    admin: MssqlSource, table: TableConfig, mssql_dsn: str, mssql_driver: str
) -> None:
    """SELECT granted on some columns only: doctor names exactly the others;
    granted on every key and published column (never on the table): no error."""
    await admin.tracking_enable([table])
    reader = LeastPrivilegeLogin.create(mssql_dsn, mssql_driver)
    source = MssqlSource(SourceConfig(kind="mssql", dsn=reader.dsn))
    try:
        reader.grant_columns(table.table, ["Id", "Price"])
        await source.connect()
        [error] = [f for f in await source.doctor([table]) if f.level == "error"]
        assert "published column(s) Status, Doubled" in error.message
        assert f"GRANT SELECT ON [dbo].[{table.name}] ([Status], [Doubled])" in error.message
        reader.grant_columns(table.table, ["Status", "Doubled"])
        findings = await source.doctor([table])
        assert [f for f in findings if f.level == "error"] == [], findings
        info = await source.describe(table)  # and the reads work with column grants alone
        since = await admin.current_version()
        run(mssql_dsn, f"INSERT INTO {table.table} (Id, Price, Status) VALUES (1, 1.00, 'a')")
        [row], _ = await changes(source, info, since)
        assert (row.op, row.key) == ("I", {"Id": 1})
    finally:
        await source.close()
        reader.drop()


@pytest.fixture
def own_database(mssql_dsn: str, mssql_driver: str) -> Iterator[str]:
    """A database of its own (snapshot isolation OFF), dropped afterwards: the DSN of it."""
    name = "CdcIso_" + uuid.uuid4().hex[:8]
    run(mssql_dsn, f"CREATE DATABASE [{name}]")
    yield Endpoint.from_dsn(mssql_dsn).dsn(mssql_driver, database=name)
    run(
        mssql_dsn,
        f"ALTER DATABASE [{name}] SET SINGLE_USER WITH ROLLBACK IMMEDIATE",
        f"DROP DATABASE [{name}]",
    )


async def test_enable_waits_for_an_open_transaction_and_says_which(
    own_database: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """ALTER DATABASE ... ALLOW_SNAPSHOT_ISOLATION ON waits for the transactions
    writing to the database; `cdc tracking enable` says which, and finishes
    once it is committed (on main: a query timeout, "SQL Server is unavailable")."""
    from cdc.sources import mssql_isolation

    monkeypatch.setattr(mssql_isolation, "PROGRESS_EVERY", 0.5)
    caplog.set_level("WARNING", logger="cdc.sources.mssql")
    run(own_database, "CREATE TABLE dbo.T (Id int NOT NULL PRIMARY KEY)")
    writer = pyodbc.connect(own_database, autocommit=False, timeout=30)
    source = MssqlSource(SourceConfig(kind="mssql", dsn=own_database, query_timeout=2.0))
    try:
        writer.execute("INSERT INTO dbo.T (Id) VALUES (1)")  # open, not committed
        session = writer.execute("SELECT @@SPID").fetchone()[0]
        await source.connect()
        enabling = asyncio.ensure_future(source.tracking_enable([]))

        async def named() -> bool:
            return any(f"session {session}" in r.getMessage() for r in caplog.records)

        await wait_for(named, 30, "a message naming the open transaction's session")
        assert not enabling.done()
        writer.commit()
        done = await asyncio.wait_for(enabling, 60)
        assert done[0].startswith("database CdcIso_") and "ALLOW_SNAPSHOT_ISOLATION ON" in done[0]
        assert (
            scalar(
                own_database,
                "SELECT snapshot_isolation_state_desc FROM sys.databases WHERE database_id = DB_ID()",
            )
            == "ON"
        )
    finally:
        writer.close()
        await source.close()
