"""SQL Server values: how each type is selected, read back and encoded (docs/TYPES.md).

No server here: the select expressions are parsed by sqlglot's T-SQL dialect,
and the converters are fed the values the drivers hand over for them (the
server's text of a CONVERT, bytes of a CAST, what FreeTDS and Microsoft ODBC
Driver 18 return for a column selected as it is). ``test_mssql_live.py`` runs
the same types against a SQL Server.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlglot import exp

from cdc.config import TableConfig
from cdc.errors import PoisonChange, SchemaError, UnsupportedType
from cdc.mapping import TableMapper
from cdc.sources import mssql_sql as sql
from cdc.sources import mssql_types as types
from cdc.sources.base import ChangeRow
from cdc.sources.mssql import MssqlSource
from cdc.sources.mssql_catalog import (
    CatalogColumn,
    DescribedTable,
    Found,
    TableName,
    _build_table,
    column_converters,
)
from cdc.sources.mssql_reads import read_values, snapshot_row, unreadable_in
from cdc.sources.mssql_select import DATE_TIME_TEXT, column_select
from cdc.templates import Template, render_key_value
from cdc.values import Unreadable, encode_value
from tests.cdc.sources.test_mssql_sql import CONFIG, FakeOdbc, parse, placeholders, table_config

# -- a table of every type ---------------------------------------------------------

ZOO = [  # (column, declared, system type)
    ("Ts", "datetime2(7)", "datetime2"),
    ("Id", "int", "int"),
    ("Dt", "datetime", "datetime"),
    ("SDt", "smalldatetime", "smalldatetime"),
    ("Dto", "datetimeoffset(7)", "datetimeoffset"),
    ("Tm", "time(7)", "time"),
    ("D", "date", "date"),
    ("X", "xml", "xml"),
    ("H", "hierarchyid", "hierarchyid"),
    ("G", "geometry", "geometry"),
    ("Geo", "geography", "geography"),
    ("V", "sql_variant", "sql_variant"),
    ("Price", "decimal(12,2)", "decimal"),
]


def zoo(key: int = 2) -> DescribedTable:
    """dbo.Zoo as describe builds it, its first ``key`` columns the primary key."""
    columns = [CatalogColumn(name, declared, base, True, False) for name, declared, base in ZOO]
    return _build_table(
        TableName("dbo.Zoo", "dbo", "Zoo"),
        Found(77, "object 77"),
        columns[:key],
        columns,
        column_converters("dbo.Zoo", columns, key),
        (1, 0),
    )


def zoo_config() -> TableConfig:
    return TableConfig(
        table="dbo.Zoo",
        schema="dbo",
        name="Zoo",
        section="zoo",
        partition=Template.parse("p"),
        key=None,
        columns=None,
    )


# -- how each column is selected ------------------------------------------------------


@pytest.mark.parametrize("base", sorted(types.CONVERTERS))
def test_every_supported_type_has_a_select_expression_that_parses(base: str) -> None:
    expression = column_select("t.[c]", base)
    tree = parse(f"SELECT {expression} FROM [dbo].[T] AS t")
    assert placeholders(tree) == 0
    assert {c.name for c in tree.find_all(exp.Column)} == {"c"}


def test_the_types_a_driver_cannot_hand_over_exactly_are_selected_as_the_servers_text_or_bytes() -> None:
    assert column_select("t.[c]", "datetime2") == "CONVERT(nvarchar(40), t.[c], 121)"
    assert DATE_TIME_TEXT == {"datetime2", "datetimeoffset", "time", "datetime", "smalldatetime"}
    assert column_select("t.[c]", "hierarchyid") == "CAST(t.[c] AS nvarchar(4000))"
    assert column_select("t.[c]", "geography") == "CAST(t.[c] AS varbinary(max))"
    assert column_select("t.[c]", "xml") == "CAST(t.[c] AS nvarchar(max))"
    variant = column_select("t.[c]", "sql_variant")
    assert variant.startswith("CASE WHEN t.[c] IS NULL THEN NULL ELSE CONCAT(")
    # every base type "SQL_VARIANT_PROPERTY (Transact-SQL)" lists is read back
    assert set(types.VARIANT_TEXT) == set(
        "bigint binary bit char date datetime datetime2 datetimeoffset decimal float int money nchar numeric "
        "nvarchar real smalldatetime smallint smallmoney time tinyint uniqueidentifier varbinary varchar".split()
    )
    for styled in (
        "float",
        "real",
        "money",
        "smallmoney",
        "binary",
        "varbinary",
        "datetime2",
        "time",
        "date",
    ):
        assert f"WHEN N'{styled}' THEN CONVERT(nvarchar(max), CAST(t.[c] AS " in variant
    for plain in ("int", "decimal(12,2)", "nvarchar(50)", "varbinary(max)", "date", "uniqueidentifier", None):
        assert column_select("t.[c]", plain) == "t.[c]"


@pytest.mark.parametrize(
    ("declared", "selected"),
    [
        ("varchar(50)", "CAST(t.[c] AS nvarchar(50))"),
        ("char(10)", "CAST(t.[c] AS nvarchar(10))"),
        ("varchar(4000)", "CAST(t.[c] AS nvarchar(4000))"),
        ("varchar(8000)", "CAST(t.[c] AS nvarchar(max))"),
        ("varchar(max)", "CAST(t.[c] AS nvarchar(max))"),
        ("text", "CAST(t.[c] AS nvarchar(max))"),
    ],
)
def test_character_columns_are_read_as_nvarchar_whatever_the_client_charset(
    declared: str, selected: str
) -> None:
    """A varchar's bytes would reach a FreeTDS client in ISO 8859-1 unless its
    charset is set: as nvarchar, the server converts from the column's code
    page and the driver hands over UTF-16, exact for every character."""
    assert column_select("t.[c]", declared) == selected
    assert parse(f"SELECT {selected} FROM t") is not None


def test_reads_select_keys_and_columns_through_their_expressions() -> None:
    shape = zoo().shape
    assert shape.column_types[:2] == ("datetime2(7)", "int")
    changes = sql.changes(shape, since=5, upto=9, limit=100, after=(7, ["2026-01-01 00:00:00.0000001", 1]))
    tree = parse(changes)
    assert placeholders(tree) == len(changes.params)
    selected = [e.sql("tsql") for e in tree.expressions]
    assert selected[4:7] == [  # ct.<key> (a delete's key too), then t.<columns>
        "CONVERT(NVARCHAR(40), ct.[Ts], 121)",
        "ct.[Id]",
        "CONVERT(NVARCHAR(40), t.[Ts], 121)",
    ]
    assert "CAST(t.[H] AS NVARCHAR(4000))" in selected and "CAST(t.[G] AS VARBINARY(MAX))" in selected
    snapshot = sql.snapshot_page(shape, limit=100, after=["2026-01-01 00:00:00.0000001", 1])
    tree = parse(snapshot)
    assert placeholders(tree) == len(snapshot.params)
    assert [e.sql("tsql") for e in tree.expressions][:2] == ["CONVERT(NVARCHAR(40), t.[Ts], 121)", "t.[Id]"]


# -- dates and times keep 100 ns; today's encodings stay where the 7th digit is 0 ------------------


def test_the_seventh_digit_is_kept_and_two_keys_below_a_microsecond_are_two_documents() -> None:
    """Issue 14 item 1's remainder: pyodbc cut ``...123456`` and ``...1234567``
    to one datetime, so one document key; read as the server's text they are two."""
    described, mapper = zoo(key=1), TableMapper(zoo_config(), zoo(key=1).info, max_row_bytes=1 << 20)
    keys = set()
    for text in ("2026-11-21 23:00:00.1234560", "2026-11-21 23:00:00.1234567"):
        row = snapshot_row(described, [text, 1, *[None] * (len(ZOO) - 2)])
        keys.add(mapper.from_snapshot(row, version=1).key)
    assert keys == {"2026-11-21T23:00:00.123456", "2026-11-21T23:00:00.1234567"}


_OFFSETS = st.integers(min_value=-14 * 60, max_value=14 * 60).map(
    lambda m: dt.timezone(dt.timedelta(minutes=m))
)


def style_121(value: dt.datetime | dt.time, scale: int = 7) -> str:
    """What CONVERT(nvarchar(40), x, 121) writes for a value of scale ``scale``."""
    text = f"{value.hour:02d}:{value.minute:02d}:{value.second:02d}"
    if isinstance(value, dt.datetime):
        text = f"{value.year:04d}-{value.month:02d}-{value.day:02d} {text}"
    fraction = f"{value.microsecond:06d}0"[:scale]
    text += f".{fraction}" if scale else ""
    offset = value.utcoffset()
    if offset is not None:
        minutes = int(offset.total_seconds()) // 60
        text += f" {'-' if minutes < 0 else '+'}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"
    return text


@given(st.datetimes(), st.integers(min_value=0, max_value=7))
def test_a_datetime2_whose_7th_digit_is_0_encodes_as_before(value: dt.datetime, scale: int) -> None:
    """Before, pyodbc's datetime was encoded (its key rendered): the same text now."""
    value = value.replace(microsecond=int(f"{value.microsecond:06d}"[:scale].ljust(6, "0")))
    now = types.iso_datetime(style_121(value, scale))
    assert encode_value(now) == encode_value(value)
    assert render_key_value(now) == render_key_value(value)


@given(st.datetimes(timezones=_OFFSETS))
def test_a_datetimeoffset_whose_7th_digit_is_0_encodes_as_before(value: dt.datetime) -> None:
    now = types.iso_datetimeoffset(style_121(value))
    assert encode_value(now) == encode_value(value)
    assert render_key_value(now) == render_key_value(value)


@given(st.times())
def test_a_time_whose_7th_digit_is_0_encodes_as_before(value: dt.time) -> None:
    now = types.iso_time(style_121(value))
    assert encode_value(now) == encode_value(value)
    assert render_key_value(now) == render_key_value(value)


@given(st.datetimes(), st.integers(min_value=1, max_value=9))
def test_distinct_values_are_distinct_texts(value: dt.datetime, tick: int) -> None:
    """One text per value: a key below a microsecond is a document of its own."""
    base = style_121(value)
    assert types.iso_datetime(base) != types.iso_datetime(base[:-1] + str(tick))
    assert types.iso_datetime(base[:-1] + str(tick)).endswith(f"{value.microsecond:06d}{tick}")


# -- hierarchyid, spatial, sql_variant ----------------------------------------------------


def test_hierarchyid_is_its_path() -> None:
    assert types.to_hierarchyid("/1/2/") == "/1/2/" and types.to_hierarchyid("/") == "/"
    assert encode_value(types.to_hierarchyid("/1/2.5/")) == b'"/1/2.5/"'
    with pytest.raises(ValueError, match="not a hierarchyid path"):
        types.to_hierarchyid("1/2")


def test_geometry_and_geography_are_their_serialized_bytes_in_base64() -> None:
    point = bytes.fromhex("E6100000010C0000000000004440000000000000F03F")  # SRID 4326, a point
    for given_as in (point, bytearray(point), memoryview(point)):
        assert types.to_spatial(given_as) == point
    assert encode_value(types.to_spatial(point)) == b'"5hAAAAEMAAAAAAAAREAAAAAAAADwPw=="'
    with pytest.raises(ValueError, match="serialized bytes"):
        types.to_spatial("POINT (1 2)")


@pytest.mark.parametrize(
    ("text", "json"),
    [
        ("int:5", b'{"type":"int","value":5}'),
        ("bigint:-9223372036854775808", b'{"type":"bigint","value":-9223372036854775808}'),
        ("bit:1", b'{"type":"bit","value":true}'),
        ("decimal:12.50", b'{"type":"decimal","value":"12.50"}'),
        ("numeric:-0.0001", b'{"type":"numeric","value":"-0.0001"}'),
        ("money:-922337203685477.5808", b'{"type":"money","value":"-922337203685477.5808"}'),
        ("float:0.10000000000000001", b'{"type":"float","value":0.1}'),
        ("real:1.10000002", b'{"type":"real","value":1.1}'),
        ("nvarchar:a:b", b'{"type":"nvarchar","value":"a:b"}'),
        ("char:ab  ", b'{"type":"char","value":"ab  "}'),
        ("varbinary:0x00FF10", b'{"type":"varbinary","value":"AP8Q"}'),
        ("binary:0x", b'{"type":"binary","value":""}'),
        ("uniqueidentifier:6F9619FF-8B86-D011-B42D-00C04FC964FF", b'"6f9619ff-8b86-d011-b42d-00c04fc964ff"'),
        ("date:2026-11-21", b'{"type":"date","value":"2026-11-21"}'),
        (
            "datetime2:2026-11-21 23:00:00.1234567",
            b'{"type":"datetime2","value":"2026-11-21T23:00:00.1234567"}',
        ),
        ("datetime:2026-11-21 23:00:00.997", b'{"type":"datetime","value":"2026-11-21T23:00:00.997000"}'),
        ("time:23:59:59.0000000", b'{"type":"time","value":"23:59:59"}'),
        (
            "datetimeoffset:2026-11-21 23:00:00.1234567 -05:30",
            b'{"type":"datetimeoffset","value":"2026-11-21T23:00:00.1234567-05:30"}',
        ),
    ],
)
def test_a_sql_variant_is_its_base_type_and_its_value(text: str, json: bytes) -> None:
    value = types.to_variant(text)
    if text.startswith("uniqueidentifier"):
        assert value == {"type": "uniqueidentifier", "value": json.decode().strip('"')}
    else:
        assert encode_value(value) == json


@pytest.mark.parametrize("text", ["5", "sql_variant:5", "xml:<a/>", "int:five", "varbinary:00FF"])
def test_a_sql_variant_that_cannot_be_read_raises(text: str) -> None:
    with pytest.raises(ValueError):
        types.to_variant(text)


def test_decimal_values_keep_their_scale_in_a_variant() -> None:
    assert types.to_variant("decimal:1.000")["value"] == Decimal("1.000")


# -- a value that cannot be read: one marker for both sources ---------------------------------


def raw_row(**values: Any) -> list[Any]:
    row: dict[str, Any] = {name: None for name, _, _ in ZOO}
    row.update({"Ts": "2026-11-21 23:00:00.1234567", "Id": 1, **values})
    return list(row.values())


def test_a_value_that_cannot_be_read_is_unreadable_and_its_row_goes_to_the_dead_letter() -> None:
    described = zoo()
    values = read_values(described, described.shape.columns, raw_row(H="not a path", Price="twelve"))
    assert isinstance(values["H"], Unreadable) and isinstance(values["Price"], Unreadable)
    assert values["Id"] == 1 and values["Ts"] == "2026-11-21T23:00:00.1234567"  # the others are read
    mapper = TableMapper(zoo_config(), described.info, max_row_bytes=1 << 20)
    row = ChangeRow("U", 9, {"Ts": values["Ts"], "Id": 1}, values)
    with pytest.raises(PoisonChange) as caught:
        mapper.from_row(row)
    assert str(caught.value).startswith("column H: hierarchyid value 'not a path' cannot be read")
    assert mapper.describe_key(row.key) == "Ts='2026-11-21T23:00:00.1234567', Id=1"  # the dead letter's key
    assert unreadable_in("dbo.Zoo", None, {"Id": 1}, values) == (
        "dbo.Zoo: column H: hierarchyid value 'not a path' cannot be read as its described type "
        "('not a path' is not a hierarchyid path): the table changed while it was read; it will be "
        "described again (ALTER COLUMN?)"
    )
    assert unreadable_in("dbo.Zoo", {"Id": 1}, None) is None


def test_a_decimal_that_cannot_be_read_says_so_in_words() -> None:
    values = read_values(zoo(), zoo().shape.columns, raw_row(Price="twelve"))
    assert values["Price"] == Unreadable(
        "decimal(12,2) value 'twelve' cannot be read as its described type (not a number)"
    )


def test_a_long_value_is_cut_in_the_reason() -> None:
    values = read_values(zoo(), zoo().shape.columns, raw_row(H="x" * 500))
    assert isinstance(values["H"], Unreadable) and len(values["H"].reason) < 250


def test_a_key_value_that_cannot_be_read_is_a_schema_error_naming_the_column() -> None:
    with pytest.raises(
        SchemaError, match=r"^dbo\.Zoo: column Ts: datetime2\(7\) value 'soon' cannot be read"
    ):
        snapshot_row(zoo(), raw_row(Ts="soon"))


# -- a type that cannot be mirrored: refused before anything is installed ------------------------


@pytest.mark.parametrize(
    ("columns", "refused"),
    [(None, True), (("Price", "Shape"), True), (("Price", "Status"), False)],
)
async def test_tracking_enable_refuses_a_table_it_could_not_mirror_before_installing_anything(
    columns: tuple[str, ...] | None, refused: bool
) -> None:
    """A published CLR column: `cdc tracking enable` raises UnsupportedType
    naming table, column and fix, and sends no ALTER (not even the
    database's); leaving the column out of `columns:` enables the table."""
    fake = FakeOdbc()
    fake.database = ("CdcDemo", 0, "OFF", None, None, None, None)
    fake.tracking = []
    fake.catalog.append((5, "Shape", "MyPoint", None, 1, -1, 0, 0, 1, 0))
    source = MssqlSource(CONFIG, connector=fake.connect)
    try:
        if refused:
            with pytest.raises(
                UnsupportedType, match=r"^dbo\.Forecasts\.Shape: type MyPoint .*CLR.*columns:"
            ):
                await source.tracking_enable([table_config(columns)])
            assert not [text for text, _ in fake.log if text.startswith("ALTER")]
        else:
            await source.tracking_enable([table_config(columns)])
            assert [text for text, _ in fake.log if text.startswith("ALTER TABLE")]
    finally:
        await source.close()
