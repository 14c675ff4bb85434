"""PostgreSQL values, read by the real source: every type of the zoo
(tests/cdc/pg_type_zoo.py) reads as the JSON docs/TYPES.md says; a value
with no JSON spelling sends its row to the dead letter naming the column,
while the read goes on; keys of every kind page; the types that cannot be
mirrored are refused before anything is installed.

The sidecar end to end over the same zoo is tests/cdc/test_type_zoo_e2e.py.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st
from psycopg import sql
from psycopg.conninfo import make_conninfo

from cdc.config import SourceConfig, TableConfig
from cdc.errors import PoisonChange, UnsupportedType
from cdc.mapping import TableMapper
from cdc.sources.pg_types import MoneyLoader, RawJsonLoader, _lone_surrogate, iso_datetime, iso_time
from cdc.sources.postgres import PostgresSource
from cdc.values import RawJson, Unreadable, encode_value
from tests.cdc.pg_type_zoo import DEAD, EXTENSION_ZOO, EXTENSIONS, SETUP, ZOO, Case, quoted
from tests.contract.harness import PostgresHarness, make_table_config, read_all


@pytest.fixture
async def pg(request: pytest.FixtureRequest) -> AsyncIterator[PostgresHarness]:
    async with PostgresHarness.running(request) as harness:
        assert isinstance(harness, PostgresHarness)
        yield harness


async def execute(pg: PostgresHarness, statement: str) -> None:
    await pg.admin.execute(quoted(statement, pg.schema))
    await pg.settle()


async def zoo_table(pg: PostgresHarness, name: str, cases: Mapping[str, Case]) -> TableConfig:
    columns = {"id": "int", **{column: quoted(case.type, pg.schema) for column, case in cases.items()}}
    return await pg.create_table(name, columns, ["id"])


def mismatches(values: Mapping[str, Any], cases: Mapping[str, Case]) -> dict[str, tuple[bytes, bytes]]:
    """column -> (documented, actual) for every column that differs."""
    out = {}
    for column, case in cases.items():
        try:
            actual = encode_value(values[column], column)
        except PoisonChange as exc:
            actual = str(exc).encode()
        if actual != case.json:
            out[column] = (case.json, actual)
    return out


async def read_zoo(pg: PostgresHarness, name: str, cases: Mapping[str, Case]) -> None:
    """A row of every case, and a row of NULLs, read as changes and by a
    snapshot: each value encodes as documented, each NULL as null."""
    table = await zoo_table(pg, name, cases)
    info = await pg.source.describe(table)
    since = await pg.source.current_version()
    await pg.insert_literals(
        table, {"id": "1", **{c: quoted(case.literal, pg.schema) for c, case in cases.items()}}
    )
    await pg.insert_literals(table, {"id": "2"})

    rows, _ = await read_all(pg.source, info, since)
    snapshot = [row async for page in pg.source.snapshot(info, page_size=1) for row in page.rows]

    changed = {row.key["id"]: row.values for row in rows}
    for values, nulls in ((changed[1], changed[2]), (snapshot[0], snapshot[1])):
        assert values is not None and nulls is not None
        assert mismatches(values, cases) == {}
        assert {c: encode_value(nulls[c], c) for c in cases} == dict.fromkeys(cases, b"null")


async def test_every_type_reads_as_its_documented_json(pg: PostgresHarness) -> None:
    for statement in SETUP:
        await execute(pg, statement)
    await read_zoo(pg, "zoo", ZOO)


async def test_extension_types_read_as_documented_json(pg: PostgresHarness) -> None:
    for extension in EXTENSIONS:
        try:
            await execute(pg, f"create extension if not exists {extension} with schema {{s}}")
        except psycopg.Error as exc:
            pytest.skip(f"extension {extension} cannot be created here: {exc}")
    # hstore loads by oid: the reader, prepared before it existed, learns it when the table is described
    await read_zoo(pg, "ext", EXTENSION_ZOO)


async def test_json_is_the_servers_own_text(pg: PostgresHarness) -> None:
    """Whatever the json/jsonb value, the document holds exactly what the server prints."""
    values = [
        '{"pi": 3.141592653589793238462643383279}',
        "[1e400, -1E-400, 0.1000, 123456789012345678901234567890]",
        '{"b": {"a": [1, {"c": null}]}, "a": "\\ud83c\\udf89 \\u00e9 \\\\ \\""}',
        '"just a string"',
    ]
    table = await pg.create_table("docs", {"id": "int", "j": "json", "b": "jsonb"}, ["id"])
    info = await pg.source.describe(table)
    for i, value in enumerate(values):
        await pg.insert_literals(table, {"id": str(i), "j": sql.quote(value), "b": sql.quote(value)})
    snapshot = [row async for page in pg.source.snapshot(info, page_size=100) for row in page.rows]
    printed = await (
        await pg.admin.execute(quoted("select j::text, b::text from {s}.docs order by id", pg.schema))
    ).fetchall()

    assert [(encode_value(r["j"]), encode_value(r["b"])) for r in snapshot] == [
        (j.encode(), b.encode()) for j, b in printed
    ]
    assert printed[1][1].startswith("[1" + "0" * 400 + ", -0.")  # jsonb prints numbers in full


# -- values with no JSON spelling: the row to the dead letter, the read goes on --------------


async def test_a_value_with_no_json_spelling_dead_letters_its_row_and_the_read_goes_on(
    pg: PostgresHarness,
) -> None:
    columns = {"id": "int", "ok": "text", **{name: case.type for name, case in DEAD.items()}}
    table = await pg.create_table("dead", columns, ["id"])
    info = await pg.source.describe(table)
    mapper = TableMapper(table, info, max_row_bytes=1 << 20)
    since = await pg.source.current_version()
    await pg.insert_literals(table, {"id": "0", "ok": "'before'"})
    for i, (name, case) in enumerate(DEAD.items(), start=1):
        await pg.insert_literals(table, {"id": str(i), name: case.literal})
    await pg.insert_literals(table, {"id": "99", "ok": "'after'"})

    rows, _ = await read_all(pg.source, info, since, limit=3)  # several pages, each loads
    snapshot = [row async for page in pg.source.snapshot(info, page_size=2) for row in page.rows]

    by_id = {row.key["id"]: row for row in rows}
    assert sorted(by_id) == [0, *range(1, len(DEAD) + 1), 99]
    for values in (*(row.values for row in rows), *snapshot):
        assert values is not None
        bad = [name for name in DEAD if values[name] is not None]
        if not bad:
            assert mapper.encode(values, {"id": values["id"]})["ok"] in (b'"before"', b'"after"')
            continue
        [name] = bad
        with pytest.raises(PoisonChange, match=rf"^column {name}: .*{re.escape(DEAD[name].reason)}"):
            mapper.encode(values, {"id": values["id"]})


# -- keys of every kind page through reads and snapshots -------------------------------------

KEYS = {
    "date": (["'infinity'", "'-infinity'", "'0044-03-15 BC'", "'10000-01-01'", "'2024-01-01'"],
             ["-infinity", "-0043-03-15", "2024-01-01", "+10000-01-01", "infinity"]),
    "timestamptz": (["'infinity'", "'0044-03-15 10:00:00+00 BC'", "'2024-01-01 00:00+00'"],
                    ["-0043-03-15T10:00:00+00:00", "2024-01-01T00:00:00+00:00", "infinity"]),
    "time": (["'24:00:00'", "'08:00'"], ["08:00:00", "24:00:00"]),
    "money": (["'-1.50'", "'12.34'"], ["-1.50", "12.34"]),
    "jsonb": (["'{\"a\": [1, 2.50]}'", "'1e400'"], ["1" + "0" * 400, '{"a": [1, 2.50]}']),
    "inet": (["'10.0.0.2'", "'10.0.0.1/8'"], ["10.0.0.1/8", "10.0.0.2"]),
    "int4range": (["'[1,3)'", "'empty'"], ["empty", "[1,3)"]),
}  # fmt: skip


@pytest.mark.parametrize("kind", KEYS)
async def test_keys_of_every_kind_page_and_render_as_their_json_text(pg: PostgresHarness, kind: str) -> None:
    """A page's last key goes back to the server as the lower bound of the
    next: a value Python cannot hold (an ISO 8601 year -43), a money, a jsonb
    must reach it as the server's own text. The document key is the value's
    JSON text, unquoted."""
    literals, keys = KEYS[kind]
    table = await pg.create_table(f"k_{kind}", {"k": kind, "n": "int"}, ["k"])
    info = await pg.source.describe(table)
    mapper = TableMapper(table, info, max_row_bytes=1 << 20)
    since = await pg.source.current_version()
    for literal in literals:
        await pg.insert_literals(table, {"k": literal, "n": "1"})

    snapshot = [row async for page in pg.source.snapshot(info, page_size=1) for row in page.rows]
    rows, _ = await read_all(pg.source, info, since, limit=1)

    assert [mapper.from_snapshot(row, 1).key for row in snapshot] == keys
    assert sorted(mapper.from_row(row).key for row in rows) == sorted(keys)  # type: ignore[union-attr]


# -- what cannot be mirrored is refused, before anything is installed ------------------------


async def test_reference_types_are_refused_by_describe_and_enable_naming_the_fix(pg: PostgresHarness) -> None:
    columns = {"id": "int", "rel": "regclass", "note": "text", "kind": "regtype[]"}
    table = await pg.create_table("refs", columns, ["id"], track=False)

    with pytest.raises(UnsupportedType) as described:
        await pg.source.describe(table)
    with pytest.raises(UnsupportedType) as enabled:
        await pg.source.tracking_enable([table])

    for error in (described.value, enabled.value):
        message = str(error)
        assert message.startswith(f"{pg.schema}.refs.rel: type regclass cannot be mirrored")
        assert "columns: [id, note]" in message and "rename" in message
    installed = await (await pg.admin.execute("select to_regnamespace(%s)", [pg.tracking_schema])).fetchone()
    assert installed == (None,), "nothing was installed"
    triggers = await (await pg.admin.execute(
        "select count(*) from pg_trigger where tgrelid = to_regclass(%s)", [f'"{pg.schema}".refs']
    )).fetchone()  # fmt: skip
    assert triggers == (0,)
    left_out = make_table_config(pg.schema, "refs", ["note"])
    assert await pg.source.tracking_enable([left_out])
    assert (await pg.source.describe(left_out)).column_names == ("id", "note")
    with pytest.raises(UnsupportedType, match=r"refs\.kind: type regtype\[\] cannot be mirrored"):
        await pg.source.describe(make_table_config(pg.schema, "refs", ["kind"]))


async def test_a_primary_key_under_a_nondeterministic_collation_is_refused_naming_the_fix(
    pg: PostgresHarness,
) -> None:
    """'abc' and 'ABC' are one key to a case-insensitive collation and two
    documents to the mirror: an update from one spelling to the other would
    leave the document under the old one. Refused, before anything is
    installed; the same collation on a column outside the key is fine."""
    await execute(
        pg,
        "create collation {s}.ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false)",
    )
    ci = f'text collate "{pg.schema}".ci'
    table = await pg.create_table("ci_keys", {"k": ci, "note": "text"}, ["k"], track=False)
    with pytest.raises(UnsupportedType) as described:
        await pg.source.describe(table)
    with pytest.raises(UnsupportedType) as enabled:
        await pg.source.tracking_enable([table])
    for error in (described.value, enabled.value):
        assert str(error).startswith(f"{pg.schema}.ci_keys.k: a primary-key column under a nondeterministic")
        assert "deterministic collation" in str(error)
    triggers = await (await pg.admin.execute(
        "select count(*) from pg_trigger where tgrelid = to_regclass(%s)", [f'"{pg.schema}".ci_keys']
    )).fetchone()  # fmt: skip
    assert triggers == (0,), "nothing was installed"

    other = await pg.create_table("ci_values", {"id": "int", "note": ci}, ["id"])
    assert (await pg.source.describe(other)).column_names == ("id", "note")


async def test_types_made_after_the_reader_connected_read_as_documented(pg: PostgresHarness) -> None:
    """Array types load by oid: one made after the session was prepared is
    learnt when its table is described, on the reader that reads it."""
    await pg.source.current_version()  # the reader is connected, its loaders registered
    await execute(pg, "create type {s}.later_kind as enum ('x', 'y')")
    await execute(pg, "create domain {s}.cents as numeric(6,2)")
    columns = {"id": "int", "e": quoted("{s}.later_kind[]", pg.schema), "d": quoted("{s}.cents[]", pg.schema)}
    table = await pg.create_table("later", columns, ["id"])
    info = await pg.source.describe(table)
    since = await pg.source.current_version()
    await pg.insert_literals(table, {"id": "1", "e": "'{y,NULL,x}'", "d": "'{1.5}'"})

    rows, _ = await read_all(pg.source, info, since)

    assert rows[0].values is not None
    assert encode_value(rows[0].values["e"]) == b'["y",null,"x"]'
    assert encode_value(rows[0].values["d"]) == b'["1.50"]'


# -- the conversions alone ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "iso"),
    [
        ("infinity", "infinity"),
        ("-infinity", "-infinity"),
        ("2024-02-29", "2024-02-29"),
        ("0044-03-15 BC", "-0043-03-15"),
        ("0001-01-01 BC", "0000-01-01"),
        ("0002-01-01 BC", "-0001-01-01"),
        ("10000-01-01", "+10000-01-01"),
        ("5874897-12-31", "+5874897-12-31"),
        ("0044-03-15 10:00:00 BC", "-0043-03-15T10:00:00"),
        ("0044-03-15 10:00:00.5 BC", "-0043-03-15T10:00:00.500000"),
        ("10000-01-01 00:00:00.000001", "+10000-01-01T00:00:00.000001"),
        ("10000-01-01 00:00:00+00", "+10000-01-01T00:00:00+00:00"),
        ("10000-01-01 00:00:00+05:30", "+10000-01-01T00:00:00+05:30"),
        ("0001-01-01 00:00:00+00:19:32 BC", "0000-01-01T00:00:00+00:19:32"),
        ("garbage", None),
        ("2024-02-29T10:00:00", None),
    ],
)
def test_dates_python_cannot_hold_in_iso_8601(text: str, iso: str | None) -> None:
    assert iso_datetime(text) == iso


@pytest.mark.parametrize(
    ("text", "iso"),
    [
        ("24:00:00", "24:00:00"),
        ("24:00:00+00", "24:00:00+00:00"),
        ("24:00:00-05:30", "24:00:00-05:30"),
        ("23:59:59.5", "23:59:59.500000"),
        ("24:00", None),
    ],
)
def test_times_python_cannot_hold_in_iso_8601(text: str, iso: str | None) -> None:
    assert iso_time(text) == iso


@pytest.mark.parametrize(
    ("printed", "scale", "value"),
    [
        ("$1,234.56", 2, "1234.56"),  # C, en_US
        ("-$1,234.56", 2, "-1234.56"),
        ("($5.00)", 2, "-5.00"),  # negative in parentheses (n_sign_posn 0)
        ("-1.234,56 €", 2, "-1234.56"),  # de_DE
        ("1 234,56 €", 2, "1234.56"),  # fr_FR (narrow no-break space)
        ("￥1,235", 0, "1235"),  # ja_JP: no fraction digits
        ("KD 1,234.567", 3, "1234.567"),  # Kuwaiti dinar: three
        ("$0.00", 2, "0.00"),
        ("-$92,233,720,368,547,758.08", 2, "-92233720368547758.08"),
    ],
)
def test_money_is_its_digits_whatever_the_locale_prints(printed: str, scale: int, value: str) -> None:
    loader = type("L", (MoneyLoader,), {"scale": scale})(790)
    loaded = loader.load(printed.encode())
    assert encode_value(loaded) == f'"{value}"'.encode()
    assert getattr(loaded, "source", None) == printed
    assert isinstance(loader.load(b"$"), Unreadable)


@pytest.mark.parametrize(
    ("text", "lone"),
    [
        (rb'"\ud800"', r"\ud800"),
        (rb'{"k": "a\uDFFF"}', r"\uDFFF"),
        (rb'["\ud83c\udf89", "\udf89\ud83c"]', r"\udf89"),
        (rb'"\ud83c\udf89"', None),  # a pair: one character
        (rb'"\\ud800"', None),  # an escaped backslash, then letters
        (rb'"\\\ud800"', r"\ud800"),
        (rb'"\u00e9 \ue000"', None),
    ],
)
def test_json_escaping_half_a_surrogate_pair_is_unreadable(text: bytes, lone: str | None) -> None:
    loaded = RawJsonLoader(114).load(text)
    if lone is None:
        assert loaded == RawJson(text)
    else:
        assert isinstance(loaded, Unreadable) and f"({lone})" in loaded.reason


escape_fragments = st.lists(
    st.sampled_from(
        [
            b"\\",
            b"\\u",
            b"\\ud800",
            b"\\uD83C",
            b"\\udf89",
            b"\\uDFFF",
            b"\\u00e9",
            b"u",
            b"d",
            b"D",
            b"a",
            b'"',
        ]
    ),
    max_size=8,
).map(b"".join)


@given(escape_fragments)
def test_the_json_loaders_surrogate_search_finds_what_the_full_scan_finds(text: bytes) -> None:
    """The loader looks for a surrogate escape with one regular expression
    (``_SURROGATE_HINT``) before scanning the escapes: it must dead-letter
    exactly the texts the full scan (``_lone_surrogate``) finds one in."""
    loaded = RawJsonLoader(114).load(text)
    lone = _lone_surrogate(text)
    if lone is None:
        assert loaded == RawJson(text)
    else:
        assert isinstance(loaded, Unreadable) and f"({lone})" in loaded.reason


# -- a SQL_ASCII database: any bytes, and only UTF-8 can be mirrored ---------------------------


@pytest.fixture
async def ascii_dsn(postgres_dsn: str) -> AsyncIterator[str]:
    """A database created with encoding SQL_ASCII, which stores any bytes as text."""
    name = "ascii_" + uuid.uuid4().hex[:8]
    async with await psycopg.AsyncConnection.connect(postgres_dsn, autocommit=True) as admin:
        try:
            await admin.execute(
                sql.SQL(
                    "create database {} encoding 'SQL_ASCII' template template0 lc_collate 'C' lc_ctype 'C'"
                ).format(sql.Identifier(name))
            )
        except psycopg.Error as exc:
            pytest.skip(f"cannot create a SQL_ASCII database here: {exc}")
        try:
            yield make_conninfo(postgres_dsn, dbname=name)
        finally:
            await admin.execute(sql.SQL("drop database {} with (force)").format(sql.Identifier(name)))


async def test_text_that_is_not_utf8_in_a_sql_ascii_database_dead_letters_its_row(ascii_dsn: str) -> None:
    """The server will not convert such bytes to UTF8 (one would fail the whole
    read), so the session stays SQL_ASCII and each text is decoded alone."""
    async with await psycopg.AsyncConnection.connect(ascii_dsn, autocommit=True) as conn:
        await conn.execute("create table t (id int primary key, note text, tags text[], doc json)")
        await conn.execute(
            "insert into t values (1, 'ok', '{a}', '[1]'), (3, 'fine', '{b}', '{\"k\": 2}'),"
            " (2, convert_from('\\xff41'::bytea, 'SQL_ASCII'), null, null),"
            " (4, null, array[convert_from('\\xfe'::bytea, 'SQL_ASCII')], null),"
            " (5, null, null, convert_from('\\x22c322'::bytea, 'SQL_ASCII')::json)"
        )
    table = make_table_config("public", "t")
    source = PostgresSource(SourceConfig(kind="postgres", dsn=ascii_dsn, tracking_schema="cdc_trk"))
    await source.connect()
    try:
        info = await source.describe(table)
        mapper = TableMapper(table, info, max_row_bytes=1 << 20)
        rows = [row async for page in source.snapshot(info, page_size=2) for row in page.rows]
    finally:
        await source.close()

    encoded = {row["id"]: mapper.encode(row, row) for row in rows if row["id"] in (1, 3)}
    assert encoded[1] == {"id": b"1", "note": b'"ok"', "tags": b'["a"]', "doc": b"[1]"}
    assert encoded[3]["doc"] == b'{"k": 2}'
    for key, column in ((2, "note"), (4, "tags"), (5, "doc")):
        [row] = [r for r in rows if r["id"] == key]
        with pytest.raises(PoisonChange, match=rf"^column {column}: text .* is not UTF-8 .*SQL_ASCII"):
            mapper.encode(row, row)
