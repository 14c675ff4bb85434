"""The SQL Server source's T-SQL, checked without a SQL Server.

- Every statement the builders generate is parsed by sqlglot's T-SQL dialect.
  sqlglot lacks two T-SQL constructs the source must use, ``CHANGETABLE(CHANGES
  t, v)`` and ``ISOLATION LEVEL SNAPSHOT``: ``TsqlCT`` below teaches it exactly
  those two (strictly: anything else still fails), and each statement that
  needs them is also parsed by plain ``tsql`` with them swapped for their
  nearest plain form, so plain tsql's only objection is known. ALTER
  DATABASE/TABLE options have no sqlglot grammar (it falls back to a Command):
  their exact text is asserted instead.
- Placeholders are counted on the parsed tree and must match the parameters.
- ``FakeOdbc`` records the statements the source sends, in order, on which
  thread. It answers the catalog and version queries, and a table's object_id
  and fingerprint text, from a script (it never computes one), and runs
  the change and snapshot queries (translated by sqlglot) on sqlite with a
  ``ct_src`` table standing in for CHANGETABLE: that checks the query's logic
  (LEFT JOIN, keyset pages, ``<= upto``), never SQL Server's behaviour, which
  only tests/cdc/sources/test_mssql_live.py can show.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import re
import sqlite3
import threading
from collections.abc import Callable, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyodbc
import pytest
import sqlglot
import yaml
from sqlglot import exp
from sqlglot.dialects.tsql import TSQL
from sqlglot.tokens import TokenType

from cdc.config import SourceConfig, TableConfig, load_config
from cdc.errors import (
    MissingColumn,
    PoisonChange,
    SchemaError,
    SourceUnavailable,
    TrackingExpired,
    TrackingNotEnabled,
    UnsupportedType,
)
from cdc.mapping import TableMapper
from cdc.sources import mssql_backlog_sql as backlog
from cdc.sources import mssql_held, mssql_reads
from cdc.sources import mssql_sql as sql
from cdc.sources import mssql_sql_catalog as catalog_sql
from cdc.sources.base import ChangeSource, TableInfo
from cdc.sources.mssql import MssqlSource
from cdc.sources.mssql_dsn import parse_dsn
from cdc.templates import Template
from tests.e2e import wait_for

# -- sqlglot, taught CHANGETABLE and SNAPSHOT --------------------------------


class TsqlCT(TSQL):
    class Parser(TSQL.Parser):
        TRANSACTION_CHARACTERISTICS = {
            **TSQL.Parser.TRANSACTION_CHARACTERISTICS,
            "ISOLATION": (*TSQL.Parser.TRANSACTION_CHARACTERISTICS["ISOLATION"], ("LEVEL", "SNAPSHOT")),
        }

        def _parse_changetable(self) -> exp.Expression:
            if not self._match_text_seq("CHANGES"):
                self.raise_error("CHANGETABLE: expected CHANGES")
            table = self._parse_table_parts()
            if not self._match(TokenType.COMMA):
                self.raise_error("CHANGETABLE: expected a comma after the table")
            since = self._parse_assignment()
            return exp.Anonymous(this="CHANGETABLE", expressions=[exp.var("CHANGES"), table, since])

        FUNCTION_PARSERS = {
            **TSQL.Parser.FUNCTION_PARSERS,
            "CHANGETABLE": lambda self: self._parse_changetable(),
        }


_CHANGETABLE = re.compile(r"CHANGETABLE\(CHANGES (.+?), \?\)(?= AS ct )")


def parse(statement: sql.Statement | str) -> exp.Expression:
    """Parse with plain tsql, or (for the two known gaps) with TsqlCT, after
    checking that plain tsql accepts the statement with the gap swapped out."""
    text = statement if isinstance(statement, str) else statement.sql
    try:
        return sqlglot.parse_one(text, read="tsql")
    except sqlglot.errors.ParseError:
        pass
    plain = _CHANGETABLE.sub(r"\1", text).replace("ISOLATION LEVEL SNAPSHOT", "ISOLATION LEVEL SERIALIZABLE")
    assert plain != text, f"plain tsql rejects {text!r} for a reason other than the two known gaps"
    sqlglot.parse_one(plain, read="tsql")
    return sqlglot.parse_one(text, read=TsqlCT)


def placeholders(tree: exp.Expression) -> int:
    return len(list(tree.find_all(exp.Placeholder)))


# -- shapes ---------------------------------------------------------------------

SIMPLE = sql.TableShape(
    schema="dbo",
    name="Forecasts",
    primary_key=("Id",),
    key_types=("int",),
    columns=("Id", "Price", "Status"),
    mask_columns=("Price", "Status"),
)
HOSTILE = sql.TableShape(
    schema="we]ird",
    name="Or[ders] x",
    primary_key=("a]b", "Line"),
    key_types=("nvarchar(10)", "int"),
    columns=("a]b", "Line", "x'); DROP TABLE t; --", "[c"),
    mask_columns=("x'); DROP TABLE t; --", "[c"),
)


def every_statement() -> list[sql.Statement]:
    out: list[sql.Statement] = []
    for shape in (SIMPLE, HOSTILE):
        key = ["k1", 2][: len(shape.primary_key)]
        out += [
            sql.min_valid_version(shape.schema, shape.name),
            sql.changes(shape, since=5, upto=9, limit=100),
            sql.changes(shape, since=5, upto=9, limit=100, after=(7, key), column_ids=[3, 4]),
            sql.column_ids_of(shape),
            backlog.create(shape),
            backlog.fill(shape, since=5, upto=9, after=None),
            backlog.fill(shape, since=5, upto=9, after=(7, key)),
            backlog.page(shape, limit=100, after_row=0, column_ids=[3, 4]),
            sql.snapshot_page(shape, limit=100),
            sql.snapshot_page(shape, limit=100, after=key),
            catalog_sql.columns(shape.schema, shape.name),
            catalog_sql.primary_key(shape.schema, shape.name),
            catalog_sql.table_tracking(shape.schema, shape.name),
            catalog_sql.fingerprints([(shape.schema, shape.name), ("dbo", "Other")]),
            catalog_sql.table_states([(shape.schema, shape.name), ("dbo", "Other")]),
            catalog_sql.table_permissions(shape.schema, shape.name),
            catalog_sql.row_estimate(shape.schema, shape.name),
            sql.enable_table_tracking(shape.schema, shape.name),
            sql.disable_table_tracking(shape.schema, shape.name),
        ]
    out += [
        sql.Statement(sql.SET_SNAPSHOT),
        sql.Statement(sql.SET_READ_COMMITTED),
        sql.Statement(sql.BEGIN),
        sql.Statement(sql.COMMIT),
        sql.Statement(sql.ROLLBACK),
        backlog.DROP,
        sql.CURRENT_VERSION,
        sql.Statement(catalog_sql.DATABASE_SETTINGS),
        sql.ENABLE_SNAPSHOT_ISOLATION,
        sql.enable_database_tracking(2 * 86400),
        sql.set_retention(36 * 3600),
    ]
    return out


@pytest.mark.parametrize("statement", every_statement(), ids=lambda s: s.sql[:60])
def test_every_statement_parses_and_its_placeholders_match_its_parameters(statement: sql.Statement) -> None:
    tree = parse(statement)
    assert placeholders(tree) == len(statement.params)


def test_hostile_identifiers_are_bracket_quoted_and_round_trip() -> None:
    assert sql.quote("a]b") == "[a]]b]"
    assert sql.quote("[c") == "[[c]"
    assert sql.qualified("we]ird", "Or[ders] x") == "[we]]ird].[Or[ders]] x]"
    for bad in ("", "x\x00y", "x" * 129):
        with pytest.raises(ValueError):
            sql.quote(bad)
    tree = parse(sql.changes(HOSTILE, since=1, upto=2, limit=3))
    names = {c.name for c in tree.find_all(exp.Column)}
    assert {"a]b", "Line", "x'); DROP TABLE t; --", "[c"} <= names
    tables = {(t.db, t.name) for t in tree.find_all(exp.Table) if t.name}
    assert ("we]ird", "Or[ders] x") in tables
    # the hostile name is in the text only as a bracketed identifier; OBJECT_ID gets the table as a parameter
    for statement in (
        sql.changes(HOSTILE, since=1, upto=2, limit=3),
        backlog.create(HOSTILE),
        backlog.fill(HOSTILE, since=1, upto=2, after=None),
        backlog.page(HOSTILE, limit=3, after_row=0, column_ids=[3, 4]),
    ):
        assert statement.sql.replace("[x'); DROP TABLE t; --]", "").count("DROP TABLE") == 0
    assert sql.column_ids_of(HOSTILE).params == ("[we]]ird].[Or[ders]] x]",)
    with pytest.raises(ValueError):
        sql.changes(
            sql.TableShape("dbo", "T", ("Id",), ("int); DROP TABLE x; --",), ("Id",)),
            since=1,
            upto=2,
            limit=1,
            after=(1, [1]),
        )


def test_changes_statement_shape() -> None:
    statement = sql.changes(SIMPLE, since=5, upto=9, limit=100, after=(7, [42]), column_ids=[2, 3])
    tree = parse(statement)
    assert isinstance(tree, exp.Select)
    selected = [e.sql("tsql") for e in tree.expressions]
    assert selected[:4] == [
        "ct.SYS_CHANGE_VERSION",
        "ct.SYS_CHANGE_CREATION_VERSION",
        "ct.SYS_CHANGE_OPERATION",
        "ct.SYS_CHANGE_COLUMNS",
    ]
    assert selected[4:8] == ["ct.[Id]", "t.[Id]", "t.[Price]", "t.[Status]"]
    assert selected[8:] == ["CHANGE_TRACKING_IS_COLUMN_IN_MASK(?, ct.SYS_CHANGE_COLUMNS)"] * 2
    join = tree.args["joins"][0]
    assert join.side == "LEFT" and join.this.alias == "t"
    assert join.args["on"].sql("tsql") == "t.[Id] = ct.[Id]"
    order = [o.this.sql("tsql") for o in tree.args["order"].expressions]
    assert order == ["ct.SYS_CHANGE_VERSION", "ct.[Id]"]
    # TOP, then the id of each masked column (read once per read), since, upto, then the keyset
    # (version twice, key once)
    assert statement.params == (100, 2, 3, 5, 9, 7, 7, 42)
    assert "CHANGETABLE(CHANGES [dbo].[Forecasts], ?) AS ct" in statement.sql
    assert "ct.SYS_CHANGE_VERSION <= ?" in statement.sql


def test_composite_keyset_is_lexicographic_and_casts_to_the_key_type() -> None:
    statement = sql.snapshot_page(HOSTILE, limit=10, after=["k", 3])
    assert (
        "WHERE (t.[a]]b] > CAST(? AS nvarchar(10)) OR (t.[a]]b] = CAST(? AS nvarchar(10)) "
        "AND t.[Line] > CAST(? AS int)))" in statement.sql
    )
    assert statement.params == (10, "k", "k", 3)
    order = [o.this.sql("tsql") for o in parse(statement).args["order"].expressions]
    assert order == ["t.[a]]b]", "t.[Line]"]


TIMED = sql.TableShape(
    schema="dbo",
    name="Readings",
    primary_key=("Ts", "Code", "Id"),
    key_types=("datetime2(7)", "varchar(20)", "int"),
    columns=("Ts", "Code", "Id", "Value"),
    key_collations=(None, "Latin1_General_100_CI_AS_SC_UTF8", None),
)


def test_date_time_and_varchar_keys_page_on_the_servers_exact_values() -> None:
    """datetime2(7) cursors are the server's text, compared back in style 121;
    a varchar key is converted in its column's collation, not the database's."""
    for statement in (
        sql.changes(TIMED, since=5, upto=9, limit=100, after=(7, ["2024-01-01 00:00:00.1234567", "é", 1])),
        sql.snapshot_page(TIMED, limit=100, after=["2024-01-01 00:00:00.1234567", "é", 1]),
    ):
        tree = parse(statement)
        assert placeholders(tree) == len(statement.params)
        assert "CONVERT(nvarchar(40), " in statement.sql and "[Ts], 121)" in statement.sql
        assert statement.sql.count("CONVERT(datetime2(7), ?, 121)") == 2
        assert statement.sql.count("CAST(? COLLATE Latin1_General_100_CI_AS_SC_UTF8 AS varchar(20))") == 2
        assert "CAST(? AS int)" in statement.sql
    with pytest.raises(ValueError, match="collation"):
        sql.snapshot_page(
            dataclasses.replace(TIMED, key_collations=(None, "x]; DROP", None)), limit=1, after=["t", "c", 1]
        )


def test_a_cursor_holds_the_raw_key_and_the_exact_text_of_date_time_keys() -> None:
    ts = dt.datetime(2024, 1, 1, 0, 0, 0, 123456)  # what the driver gives for .1234567
    row = (ts, "Ab", 3, Decimal("1.5"), "2024-01-01 00:00:00.1234567")
    assert mssql_reads.snapshot_cursor(TIMED, row) == ("2024-01-01 00:00:00.1234567", "Ab", 3)
    change = (8, 8, "U", None, ts, "Ab", 3, ts, "Ab", 3, Decimal("1.5"), "2024-01-01 00:00:00.1234567")
    assert mssql_reads.change_cursor(TIMED, change) == (8, ("2024-01-01 00:00:00.1234567", "Ab", 3))


def test_many_rows_sharing_a_datetime2_value_page_through_once() -> None:
    """The review's stall, simulated: 25 rows share one datetime2(7) value (two
    groups differing below 1 us), pages of 4. A server-side model compares
    keys exactly (100 ns ticks); the driver hands back microseconds. Cursors
    built from the converted key repeat a page forever; these do not."""
    shape = dataclasses.replace(TIMED, primary_key=("Ts", "Id"), key_types=("datetime2(7)", "int"))
    shape = dataclasses.replace(shape, columns=("Ts", "Id"), key_collations=())
    ticks = sorted((t, i) for t in (1234567, 1234568) for i in range(1, 13 + (t % 2)))

    def text(tick: int) -> str:
        return f"2024-01-01 00:00:00.{tick:07d}"

    def server_page(after: tuple[Any, ...] | None) -> list[tuple[Any, ...]]:
        def exact(value: Any) -> int:  # CONVERT(datetime2(7), ?, 121) of the cursor's value
            return int(value[-7:]) if isinstance(value, str) else value.microsecond * 10

        rest = [k for k in ticks if after is None or k > (exact(after[0]), after[1])]
        return [(dt.datetime(2024, 1, 1, 0, 0, 0, t // 10), i, text(t)) for t, i in rest[:4]]

    seen: list[tuple[str, int]] = []
    after: tuple[Any, ...] | None = None
    for _ in range(100):
        page = server_page(after)
        seen += [(r[2], r[1]) for r in page]
        if len(page) < 4:
            break
        after = mssql_reads.snapshot_cursor(shape, page[-1])
    assert seen == [(text(t), i) for t, i in ticks]


def test_no_column_tracking_means_no_mask_expressions() -> None:
    shape = sql.TableShape("dbo", "T", ("Id",), ("int",), ("Id", "V"))
    statement = sql.changes(shape, since=1, upto=2, limit=3)
    assert "CHANGE_TRACKING_IS_COLUMN_IN_MASK" not in statement.sql
    assert statement.params == (3, 1, 2)


def test_too_many_parameters_is_refused() -> None:
    wide = sql.TableShape(
        "dbo",
        "T",
        ("Id",),
        ("int",),
        ("Id", *[f"c{i}" for i in range(2100)]),
        tuple(f"c{i}" for i in range(2100)),
    )
    with pytest.raises(ValueError, match="2100"):
        sql.changes(wide, since=1, upto=2, limit=3)
    # one parameter per mask column (its id), not two: 1100 columns fit
    narrower = dataclasses.replace(wide, columns=wide.columns[:1101], mask_columns=wide.mask_columns[:1100])
    assert len(sql.changes(narrower, since=1, upto=2, limit=3).params) == 1103
    assert sql.column_ids_of(narrower).params == ("[dbo].[T]",)


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [
        (2 * 86400, (2, "DAYS")),
        (7 * 86400, (7, "DAYS")),
        (36 * 3600, (36, "HOURS")),
        (90 * 60, (90, "MINUTES")),
        (10, (1, "MINUTES")),
        (0, (1, "MINUTES")),
        (86400 + 1, (1441, "MINUTES")),
        (3600.5, (61, "MINUTES")),
    ],
)
def test_retention_is_rounded_up_to_whole_units(seconds: float, expected: tuple[int, str]) -> None:
    assert sql.retention(seconds) == expected
    assert sql.retention_seconds(*expected) >= seconds


def test_set_up_statements() -> None:
    assert sql.ENABLE_SNAPSHOT_ISOLATION.sql == "ALTER DATABASE CURRENT SET ALLOW_SNAPSHOT_ISOLATION ON"
    assert (
        sql.enable_database_tracking(2 * 86400).sql
        == "ALTER DATABASE CURRENT SET CHANGE_TRACKING = ON (CHANGE_RETENTION = 2 DAYS, AUTO_CLEANUP = ON)"
    )
    assert (
        sql.set_retention(36 * 3600).sql
        == "ALTER DATABASE CURRENT SET CHANGE_TRACKING (CHANGE_RETENTION = 36 HOURS)"
    )
    assert (
        sql.enable_table_tracking("dbo", "a]b").sql
        == "ALTER TABLE [dbo].[a]]b] ENABLE CHANGE_TRACKING WITH (TRACK_COLUMNS_UPDATED = ON)"
    )
    assert sql.disable_table_tracking("dbo", "T").sql == "ALTER TABLE [dbo].[T] DISABLE CHANGE_TRACKING"
    assert sql.retention_seconds(3, 3) == 3 * 86400
    assert sql.retention_seconds(5, "minutes") == 300


# -- a recording, sqlite-backed stand-in for a pyodbc connection --------------

CATALOG = [
    # column_id, name, type, base type, is_assembly, max_length, precision, scale, nullable, computed
    (1, "Id", "int", "int", 0, 4, 10, 0, 0, 0),
    (2, "Price", "decimal", "decimal", 0, 9, 12, 2, 1, 0),
    (3, "Status", "nvarchar", "nvarchar", 0, 40, 0, 0, 1, 0),
    (4, "Doubled", "int", "int", 0, 4, 10, 0, 1, 1),
]


class FakeOdbc:
    """Records every statement; answers like a SQL Server that tracks dbo.Forecasts."""

    def __init__(self) -> None:
        self.catalog = list(CATALOG)
        self.db = self.with_functions(_database())
        self.primary_key = [("Id",)]
        self.tracking: list[tuple[Any, ...]] = [(1, 0)]
        # what SQL Server would answer for the table's object_id and shape text: scripted, as
        # the rest (the fake only hands them back; it computes no fingerprint)
        self.object_id: int | None = 1000
        self.fingerprint = "object 1000; shape 1"
        self.min_valid: int | None = 0
        self.current: int | None = 10
        self.database = (
            "CdcDemo",
            1,
            "ON",
            10,
            2,
            3,
            1,
        )  # name, snapshot state/desc, current, retention, units, cleanup
        self.permissions = (1, 1)
        self.log: list[tuple[str, tuple[Any, ...]]] = []
        self.trail: list[tuple[str, int]] = []  # (statement kind, connection number), in order
        self.threads: set[str] = set()
        self.connections = 0
        self.fail: Callable[[str], Exception | None] = lambda text: None

    def column_name(self, column_id: int) -> str | None:
        """CHANGE_TRACKING_IS_COLUMN_IN_MASK's view of an id: the column that has it now."""
        return next((str(row[1]) for row in self.catalog if row[0] == column_id), None)

    def with_functions(self, db: sqlite3.Connection) -> sqlite3.Connection:
        """ct_src's masks list column names; the function is handed ids (as SQL Server's is)."""
        db.create_function(
            "CHANGE_TRACKING_IS_COLUMN_IN_MASK",
            2,
            lambda column_id, mask: int(mask is not None and self.column_name(column_id) in mask.split(",")),
        )
        return db

    def connect(self) -> FakeConnection:
        self.connections += 1
        return FakeConnection(self, self.connections)

    def statements(self) -> list[str]:
        return [_kind(text) for text, _ in self.log]

    def answer(self, text: str, params: tuple[Any, ...], conn: FakeConnection) -> list[tuple[Any, ...]]:
        self.log.append((text, params))
        self.trail.append((_kind(text), conn.number))
        self.threads.add(threading.current_thread().name)
        parse(sql.Statement(text, params))  # everything the source sends parses
        error = self.fail(text)
        if error is not None:
            raise error
        if text == sql.BEGIN:
            # SNAPSHOT isolation, roughly: the transaction sees the data and versions of its start
            conn.view = self.with_functions(_database(self.db))
            conn.versions = (self.min_valid, self.current)
        elif text in (sql.COMMIT, sql.ROLLBACK):
            conn.view = None
        min_valid, current = (self.min_valid, self.current) if conn.view is None else conn.versions
        if "CHANGE_TRACKING_MIN_VALID_VERSION(OBJECT_ID(?)) AS" in text:
            return [(min_valid, self.object_id)]
        if "AS fingerprint FROM (VALUES" in text:
            return [(n, *self.found(name, self.fingerprint)) for n, name in enumerate(params)]
        if "AS min_valid_version FROM (VALUES" in text:
            return [self.state(n, name, min_valid) for n, name in enumerate(params)]
        if text == sql.CURRENT_VERSION.sql:
            return [(current,)]
        if text == sql.COLUMN_IDS:
            return [(row[1], row[0]) for row in self.catalog]
        if text == catalog_sql.COLUMNS:  # with collation_name: NULL but for character columns (none here)
            return [(*row, None) for row in self.catalog]
        if text == catalog_sql.PRIMARY_KEY:
            return self.primary_key
        if text == catalog_sql.TABLE_TRACKING:
            return self.tracking
        if text == catalog_sql.ROW_ESTIMATE:
            return [(self.db.execute('SELECT COUNT(*) FROM dbo."Forecasts"').fetchone()[0],)]
        if text == catalog_sql.DATABASE_SETTINGS:
            return [self.database]
        if text == catalog_sql.TABLE_PERMISSIONS:
            return [self.permissions]
        if text.startswith(("SELECT TOP (?)", "INSERT INTO #", "CREATE TABLE #", "DROP TABLE IF")):
            return (conn.view or self.db).execute(to_sqlite(text, params)).fetchall()
        return []

    def state(self, n: int, name: str, min_valid: int | None) -> tuple[Any, ...]:
        """A TABLE_STATES row: (n, object_id, tracked object_id, columns updated, min valid version)."""
        object_id = self.found(name, None)[0]
        if object_id is None or not self.tracking:
            return n, object_id, None, None, None
        return n, object_id, object_id, self.tracking[0][0], min_valid

    def found(self, name: str, fingerprint: str | None) -> tuple[int | None, str | None]:
        """(object_id, fingerprint) of a table asked about by name: only dbo.Forecasts exists."""
        if name != "[dbo].[Forecasts]" or self.object_id is None:
            return None, None
        return self.object_id, fingerprint


def _database(contents: sqlite3.Connection | None = None) -> sqlite3.Connection:
    """The stand-in database: dbo.Forecasts and ct_src (a copy of ``contents``'s rows when given)."""
    db = sqlite3.connect(":memory:", check_same_thread=False)
    db.execute("ATTACH ':memory:' AS dbo")
    db.execute(
        'CREATE TABLE dbo."Forecasts" ("Id" INTEGER PRIMARY KEY, "Price" TEXT, "Status" TEXT, "Doubled" INTEGER)'
    )
    db.execute(
        "CREATE TABLE ct_src (SYS_CHANGE_VERSION INTEGER, SYS_CHANGE_CREATION_VERSION INTEGER, "
        'SYS_CHANGE_OPERATION TEXT, SYS_CHANGE_COLUMNS TEXT, "Id" INTEGER)'
    )
    db.create_function("OBJECT_ID", 1, lambda name: name)
    if contents is not None:
        for name, width in (('dbo."Forecasts"', 4), ("ct_src", 5)):
            rows = contents.execute(f"SELECT * FROM {name}").fetchall()
            db.executemany(f"INSERT INTO {name} VALUES ({', '.join('?' * width)})", rows)
    return db


class FakeConnection:
    def __init__(self, fake: FakeOdbc, number: int) -> None:
        self.fake = fake
        self.number = number
        self.timeout = 0
        self.converters: dict[int, Callable[[Any], Any]] = {}
        self.view: sqlite3.Connection | None = None  # the open transaction's snapshot
        self.versions: tuple[int | None, int | None] = (None, None)  # min valid, current at its start

    def add_output_converter(self, sql_type: int, fn: Callable[[Any], Any]) -> None:
        self.converters[sql_type] = fn

    def cursor(self) -> FakeCursor:
        return FakeCursor(self.fake, self)

    def close(self) -> None:
        self.fake.log.append(("<close>", ()))
        self.fake.trail.append(("CLOSE", self.number))


class FakeCursor:
    def __init__(self, fake: FakeOdbc, conn: FakeConnection) -> None:
        self.fake = fake
        self.conn = conn
        self.rows: list[tuple[Any, ...]] = []

    def execute(self, text: str, *params: Any) -> FakeCursor:
        self.rows = self.fake.answer(text, params, self.conn)
        return self

    def fetchall(self) -> list[tuple[Any, ...]]:
        return self.rows

    def close(self) -> None:
        pass


def _literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, (int, Decimal)):
        return str(value)
    return "'" + str(value).replace("'", "''") + "'"


def to_sqlite(text: str, params: Sequence[Any]) -> str:
    """The T-SQL statement with its parameters inlined, CHANGETABLE(CHANGES t, v)
    replaced by the rows of ct_src above v, in sqlite's dialect."""
    values = iter(params)
    inlined = re.sub(r"\?", lambda _: _literal(next(values)), text)
    tree = sqlglot.parse_one(inlined, read=TsqlCT)

    def swap(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Table) and isinstance(node.this, exp.Anonymous):
            since = node.this.expressions[2].sql()
            rows = sqlglot.parse_one(f"SELECT * FROM ct_src WHERE SYS_CHANGE_VERSION > {since}")
            return exp.Subquery(this=rows, alias=node.args["alias"])
        return node

    return tree.transform(swap).sql(dialect="sqlite")


def _kind(text: str) -> str:
    for marker, kind in (
        ("AS fingerprint FROM (VALUES", "FINGERPRINT"),
        ("AS min_valid_version FROM (VALUES", "STATES"),
        ("SET TRANSACTION ISOLATION LEVEL SNAPSHOT", "SNAPSHOT"),
        ("SET TRANSACTION ISOLATION LEVEL READ COMMITTED", "READ COMMITTED"),
        ("BEGIN TRANSACTION", "BEGIN"),
        ("COMMIT TRANSACTION", "COMMIT"),
        ("IF @@TRANCOUNT > 0 ROLLBACK", "ROLLBACK"),
        ("CHANGE_TRACKING_MIN_VALID_VERSION(OBJECT_ID(?)) AS", "MIN_VALID"),
        ("SELECT CHANGE_TRACKING_CURRENT_VERSION() AS current_version", "CURRENT"),
        ("CREATE TABLE #cdc_changes", "CREATE BACKLOG"),
        ("INSERT INTO #cdc_changes", "FILL BACKLOG"),
        ("DROP TABLE IF EXISTS #cdc_changes", "DROP BACKLOG"),
        ("FROM #cdc_changes", "BACKLOG PAGE"),
        ("SELECT c.name, c.column_id FROM sys.columns", "COLUMN IDS"),
        ("FROM CHANGETABLE", "CHANGES"),
        ("SELECT TOP (?) t.", "PAGE"),
        ("sys.partitions", "ESTIMATE"),
        ("ALTER ", "ALTER"),
        ("<close>", "CLOSE"),
    ):
        if text.startswith(marker) or (marker in text and marker != "ALTER "):
            return kind
    return "CATALOG"


CONFIG = SourceConfig(kind="mssql", dsn="DRIVER={FreeTDS};SERVER=db;DATABASE=CdcDemo;UID=cdc;PWD=Secret-1")


def table_config(columns: tuple[str, ...] | None = ("Price", "Status", "Doubled")) -> TableConfig:
    return TableConfig(
        table="dbo.Forecasts",
        schema="dbo",
        name="Forecasts",
        section="forecasts",
        partition=Template.parse("app1"),
        key=None,
        columns=columns,
    )


@pytest.fixture
def fake() -> FakeOdbc:
    return FakeOdbc()


async def described(fake: FakeOdbc, **kwargs: Any) -> tuple[MssqlSource, TableInfo]:
    source = MssqlSource(CONFIG, connector=fake.connect)
    await source.connect()
    info = await source.describe(table_config(**kwargs))
    return source, info


def put(fake: FakeOdbc, rows: list[tuple[Any, ...]], changes: list[tuple[Any, ...]]) -> None:
    fake.db.executemany('INSERT INTO dbo."Forecasts" VALUES (?, ?, ?, ?)', rows)
    fake.db.executemany("INSERT INTO ct_src VALUES (?, ?, ?, ?, ?)", changes)


# -- describe --------------------------------------------------------------------


async def test_describe_reads_the_catalog(fake: FakeOdbc) -> None:
    source, info = await described(fake)
    assert isinstance(source, ChangeSource)
    assert info.primary_key == ("Id",)
    assert info.column_names == ("Id", "Price", "Status", "Doubled")
    assert [c.type_name for c in info.columns] == ["int", "decimal(12,2)", "nvarchar(20)", "int"]
    assert fake.statements()[:1] == ["READ COMMITTED"]
    assert ("", ()) not in fake.log
    await source.close()


@pytest.mark.parametrize(
    ("change", "error", "words"),
    [
        (lambda f: setattr(f, "catalog", []), SchemaError, ["dbo.Forecasts", "no such table"]),
        (lambda f: setattr(f, "primary_key", []), SchemaError, ["dbo.Forecasts", "primary key"]),
        (
            lambda f: f.catalog.append((5, "Anything", "vector", "vector", 0, 8016, 0, 0, 1, 0)),
            UnsupportedType,
            ["dbo.Forecasts", "Anything", "vector", "columns:"],
        ),
        (
            lambda f: f.catalog.append((5, "Shape", "MyPoint", None, 1, -1, 0, 0, 1, 0)),
            UnsupportedType,
            ["dbo.Forecasts", "Shape", "MyPoint", "CLR", "columns:"],
        ),
    ],
)
async def test_describe_errors_name_the_table(
    fake: FakeOdbc, change: Callable[[FakeOdbc], None], error: type[Exception], words: list[str]
) -> None:
    change(fake)
    with pytest.raises(error) as caught:
        await described(fake, columns=None)
    for word in words:
        assert word in str(caught.value)


async def test_an_untracked_table_is_described_but_cannot_be_read(fake: FakeOdbc) -> None:
    """The ChangeSource contract: describe works before tracking is enabled;
    reading changes or a snapshot is TrackingNotEnabled, naming the fix."""
    fake.tracking = []
    source, info = await described(fake)
    assert info.column_names == ("Id", "Price", "Status", "Doubled")
    with pytest.raises(TrackingNotEnabled, match=r"dbo\.Forecasts.*ENABLE CHANGE_TRACKING"):
        await source.read_changes(info, 5, limit=10)
    with pytest.raises(TrackingNotEnabled, match=r"dbo\.Forecasts.*ENABLE CHANGE_TRACKING"):
        [page async for page in source.snapshot(info, page_size=10)]
    fake.tracking = [(1, 0)]  # enabled since: described again, and read
    assert (await source.read_changes(info, 5, limit=10)).next_version == 10
    await source.close()


async def test_describe_unknown_column(fake: FakeOdbc) -> None:
    """MissingColumn: the tracker names the config's `columns:` line."""
    with pytest.raises(MissingColumn, match="no column Nope") as caught:
        await described(fake, columns=("Nope",))
    assert (caught.value.table, caught.value.column) == ("dbo.Forecasts", "Nope")


async def test_a_read_of_a_column_dropped_since_describe_is_a_change_of_the_table(fake: FakeOdbc) -> None:
    """Not MissingColumn: the column is the described info's, not the config's."""
    source, info = await described(fake)
    fresh = MssqlSource(CONFIG, connector=fake.connect)  # has not described it: describes again to read
    del fake.catalog[2]  # ALTER TABLE DROP COLUMN Status
    with pytest.raises(
        SchemaError, match=r"changed since it was described \(column Status is gone\)"
    ) as caught:
        await fresh.read_changes(info, 5, limit=10)
    assert not isinstance(caught.value, MissingColumn)
    await source.close()
    await fresh.close()


# -- polls -------------------------------------------------------------------------


async def test_poll_is_one_snapshot_transaction_in_the_documented_order(fake: FakeOdbc) -> None:
    source, info = await described(fake)
    put(fake, [(1, "12.50", "new", 2)], [(8, 8, "I", None, 1)])
    fake.log.clear()
    page = await source.read_changes(info, 5, limit=100)
    assert fake.statements() == [
        "SNAPSHOT", "BEGIN", "MIN_VALID", "CURRENT", "COLUMN IDS", "CHANGES", "COMMIT"
    ]  # fmt: skip
    changes_params = fake.log[5][1]
    assert changes_params[0] == 101  # one row more than the page: whether another follows
    assert changes_params[-2:] == (5, 10)  # since, upto = current
    assert page.next_version == 10 and not page.more
    assert fake.threads and all(name.startswith("cdc-mssql") for name in fake.threads)
    assert threading.current_thread().name not in fake.threads
    await source.close()


async def test_idle_poll_still_advances_to_the_current_version(fake: FakeOdbc) -> None:
    source, info = await described(fake)
    page = await source.read_changes(info, 3, limit=10)
    assert page.rows == [] and page.next_version == 10
    await source.close()


async def test_net_operations_values_and_changed_columns(fake: FakeOdbc) -> None:
    source, info = await described(fake)
    put(
        fake,
        [(1, "12.50", "new", 2), (2, "3.00", "old", 6), (4, "1.00", "x", 2), (5, "2.00", "y", 4)],
        [
            (6, 6, "I", None, 1),  # created after since=5: I
            (7, 2, "U", "Price", 2),  # created before: U, only Price changed
            (8, None, "D", None, 3),  # D stays D
            (9, 9, "U", None, 4),  # deleted and inserted again after since: SQL Server says U, so U
            (9, 3, "U", None, 5),  # NULL mask: changed columns unknown
            (10, 3, "U", None, 6),  # non-D whose row is gone (deleted after): D
        ],
    )
    rows = (await source.read_changes(info, 5, limit=100)).rows
    assert [(r.op, r.version, r.key["Id"]) for r in rows] == [
        ("I", 6, 1),
        ("U", 7, 2),
        ("D", 8, 3),
        ("U", 9, 4),
        ("U", 9, 5),
        ("D", 10, 6),
    ]
    assert rows[0].values == {"Id": 1, "Price": Decimal("12.50"), "Status": "new", "Doubled": 2}
    assert rows[0].changed_columns is None
    assert rows[1].changed_columns == frozenset({"Price", "Doubled"})  # computed: never in the mask
    assert rows[2].values is None and rows[5].values is None
    assert rows[4].changed_columns is None
    await source.close()


@pytest.mark.parametrize(("reported", "op"), [("I", "I"), ("U", "U"), ("I ", "I"), ("u", "U")])
def test_the_operation_is_the_one_sql_server_reports(reported: str, op: str) -> None:
    """SYS_CHANGE_OPERATION decides I or U (nchar(1): a driver may pad it), not the creation version."""
    assert mssql_reads.net_operation(reported) == op


def test_an_unknown_operation_is_refused() -> None:
    with pytest.raises(ValueError, match="SYS_CHANGE_OPERATION 'X'"):
        mssql_reads.net_operation("X")


async def test_pages_cover_every_change_once_in_version_and_key_order(fake: FakeOdbc) -> None:
    source, info = await described(fake)
    put(
        fake,
        [(i, "1.00", "s", 2) for i in range(1, 8)],
        [
            (6, 1, "U", None, 3),
            (6, 1, "U", None, 1),
            (7, 1, "U", None, 2),
            (7, 1, "U", None, 7),
            (8, 1, "U", None, 5),
            (9, 1, "U", None, 4),
            (11, 1, "U", None, 6),
        ],
    )
    seen = []
    page = await source.read_changes(info, 5, limit=2)
    while True:
        assert page.next_version == 10
        seen += [(r.version, r.key["Id"]) for r in page.rows]
        if not page.more:
            break
        page = await source.read_changes(info, 5, limit=2, upto=page.next_version, after=page.cursor)
    assert seen == [(6, 1), (6, 3), (7, 2), (7, 7), (8, 5), (9, 4)]  # version 11 is above current: next poll
    await source.close()


def read_trail(fake: FakeOdbc) -> list[tuple[str, int]]:
    """The statements of reads (no catalog queries, no closes), with their connection."""
    return [(kind, n) for kind, n in fake.trail if kind not in ("CATALOG", "READ COMMITTED", "CLOSE")]


async def test_every_page_of_a_read_is_in_its_one_snapshot_transaction(fake: FakeOdbc) -> None:
    source, info = await described(fake)
    put(fake, [(i, "1.00", "s", 2) for i in range(1, 7)], [(6 + i % 3, 1, "U", None, i) for i in range(1, 7)])
    fake.trail.clear()
    pages = [await source.read_changes(info, 5, limit=2)]
    while pages[-1].more:
        last = pages[-1]
        pages.append(await source.read_changes(info, 5, limit=2, upto=last.next_version, after=last.cursor))
    assert [len(p.rows) for p in pages] == [2, 2, 2] and {p.next_version for p in pages} == {10}
    trail = read_trail(fake)
    assert [kind for kind, _ in trail] == [
        "SNAPSHOT", "BEGIN", "MIN_VALID", "CURRENT", "COLUMN IDS", "CHANGES",  # page 1
        "CREATE BACKLOG", "FILL BACKLOG", "BACKLOG PAGE",  # page 2
        "BACKLOG PAGE", "COMMIT", "DROP BACKLOG",  # page 3, the last
    ]  # fmt: skip
    [reader] = {n for _, n in trail}
    assert reader != 1  # a reader of its own, not the connection that described the table
    # the next read reuses the idle reader, in a new transaction
    fake.trail.clear()
    assert not (await source.read_changes(info, 10, limit=2)).more
    assert read_trail(fake) == [
        (k, reader) for k in ("SNAPSHOT", "BEGIN", "MIN_VALID", "CURRENT", "COLUMN IDS", "CHANGES", "COMMIT")
    ]
    await source.close()


async def test_later_pages_see_what_the_first_page_saw(fake: FakeOdbc) -> None:
    """Between pages, writers move a delivered and a pending entry above the
    bound and add a row: the read still returns each row of its snapshot once,
    with the version and operation relative to ``since`` it had there."""
    source, info = await described(fake)
    put(fake, [(i, "1.00", "s", 2) for i in range(1, 7)], [(5 + i, 5 + i, "I", None, i) for i in range(1, 7)])
    fake.current = 11
    page = await source.read_changes(info, 5, limit=2)
    delivered = list(page.rows)
    while page.more:
        moved = [delivered[-1].key["Id"], 7 - len(delivered)]
        fake.db.executemany("UPDATE ct_src SET SYS_CHANGE_VERSION = 12 WHERE Id = ?", [(k,) for k in moved])
        fake.db.execute("INSERT INTO ct_src VALUES (12, 12, 'I', NULL, ?)", (100 + len(delivered),))
        fake.current = 12
        assert page.cursor is not None
        page = await source.read_changes(info, 5, limit=2, upto=page.next_version, after=page.cursor)
        delivered += page.rows
    assert [(r.op, r.version, r.key["Id"]) for r in delivered] == [("I", 5 + i, i) for i in range(1, 7)]
    assert page.next_version == 11
    await source.close()


async def test_another_read_of_the_table_rolls_the_held_one_back(fake: FakeOdbc) -> None:
    source, info = await described(fake)
    put(fake, [(i, "1.00", "s", 2) for i in range(1, 5)], [(6, 1, "U", None, i) for i in range(1, 5)])
    first = await source.read_changes(info, 5, limit=2)
    fake.trail.clear()
    other = await source.read_changes(info, 5, limit=10)  # a new read from the start, not page 2
    assert [r.key["Id"] for r in other.rows] == [1, 2, 3, 4] and not other.more
    assert [kind for kind, _ in read_trail(fake)] == [
        "ROLLBACK", "SNAPSHOT", "BEGIN", "MIN_VALID", "CURRENT", "COLUMN IDS", "CHANGES", "COMMIT"
    ]  # fmt: skip
    # the abandoned read's next page, its transaction gone: a new one, bounded by upto
    fake.trail.clear()
    rest = await source.read_changes(info, 5, limit=2, upto=first.next_version, after=first.cursor)
    assert [r.key["Id"] for r in rest.rows] == [3, 4] and rest.next_version == 10
    assert [kind for kind, _ in read_trail(fake)] == [
        "SNAPSHOT", "BEGIN", "MIN_VALID", "CURRENT", "COLUMN IDS", "CHANGES", "COMMIT"
    ]  # fmt: skip
    await source.close()


async def test_reads_of_two_tables_hold_their_transactions_apart(fake: FakeOdbc) -> None:
    source, info = await described(fake)
    alias = dataclasses.replace(info, table="dbo.Alias")  # another registered table (same rows here)
    put(fake, [(i, "1.00", "s", 2) for i in range(1, 5)], [(6, 1, "U", None, i) for i in range(1, 5)])
    a = await source.read_changes(info, 5, limit=2)
    b = await source.read_changes(alias, 5, limit=3)
    a2 = await source.read_changes(info, 5, limit=2, upto=a.next_version, after=a.cursor)
    b2 = await source.read_changes(alias, 5, limit=3, upto=b.next_version, after=b.cursor)
    assert [r.key["Id"] for r in a.rows + a2.rows] == [1, 2, 3, 4] and not a2.more
    assert [r.key["Id"] for r in b.rows + b2.rows] == [1, 2, 3, 4] and not b2.more
    assert fake.statements().count("ROLLBACK") == 0 and fake.statements().count("COMMIT") == 2
    assert fake.connections == 3  # describe, and one reader per read held at the same time
    await source.close()


async def test_a_read_of_exactly_one_page_needs_no_second_call(fake: FakeOdbc) -> None:
    source, info = await described(fake)
    put(fake, [(i, "1.00", "s", 2) for i in range(1, 4)], [(6, 1, "U", None, i) for i in range(1, 4)])
    page = await source.read_changes(info, 5, limit=3)
    assert len(page.rows) == 3 and not page.more and page.cursor is None
    assert fake.statements()[-1] == "COMMIT"
    await source.close()


async def test_closing_the_source_rolls_back_a_held_read(fake: FakeOdbc) -> None:
    source, info = await described(fake)
    put(fake, [(i, "1.00", "s", 2) for i in range(1, 5)], [(6, 1, "U", None, i) for i in range(1, 5)])
    assert (await source.read_changes(info, 5, limit=2)).more
    [(_, reader)] = {("", n) for kind, n in fake.trail if kind == "CHANGES"}
    fake.trail.clear()
    await source.close()
    assert ("ROLLBACK", reader) in fake.trail and ("CLOSE", reader) in fake.trail
    assert fake.trail.index(("ROLLBACK", reader)) < fake.trail.index(("CLOSE", reader))
    assert "COMMIT" not in [kind for kind, _ in fake.trail]


@pytest.mark.parametrize(
    ("since", "min_valid", "current", "upto", "error"),
    [
        (5, 6, 10, None, TrackingExpired),  # cleanup or TRUNCATE passed the checkpoint
        (12, 0, 10, None, TrackingExpired),  # the database went back in time
        (5, 0, 8, 9, TrackingExpired),  # ... between two pages
        (5, None, 10, None, TrackingNotEnabled),  # NULL is an error, never a pass
        (5, 0, None, None, TrackingNotEnabled),
    ],
)
async def test_version_checks_roll_back_without_reading(
    fake: FakeOdbc,
    since: int,
    min_valid: int | None,
    current: int | None,
    upto: int | None,
    error: type[Exception],
) -> None:
    source, info = await described(fake)
    fake.min_valid, fake.current = min_valid, current
    fake.log.clear()
    with pytest.raises(error) as caught:
        await source.read_changes(info, since, limit=10, upto=upto, after=None if upto is None else (7, (1,)))
    assert "dbo.Forecasts" in str(caught.value)
    assert fake.statements() == ["SNAPSHOT", "BEGIN", "MIN_VALID", "CURRENT", "ROLLBACK"]
    await source.close()


async def test_a_link_failure_is_transient_and_the_next_call_reconnects(fake: FakeOdbc) -> None:
    source, info = await described(fake)
    fake.fail = lambda text: (
        pyodbc.OperationalError(
            "08S01", "[08S01] [FreeTDS][SQL Server]Write to the server failed (20006) (SQLExecDirectW)"
        )
        if "CHANGETABLE" in text
        else None
    )
    with pytest.raises(SourceUnavailable, match="20006"):
        await source.read_changes(info, 5, limit=10)
    # the transaction is rolled back, and the connection dropped (rolled back again, then closed)
    assert fake.statements()[-4:] == ["CHANGES", "ROLLBACK", "ROLLBACK", "CLOSE"]
    fake.fail = lambda text: None
    assert (await source.read_changes(info, 5, limit=10)).next_version == 10
    assert fake.connections == 3  # describe's, the reader's, and the reader's again
    await source.close()


# -- snapshot ----------------------------------------------------------------------


async def test_snapshot_reads_the_version_then_pages_in_one_transaction(fake: FakeOdbc) -> None:
    source, info = await described(fake)
    put(fake, [(i, f"{i}.00", "s", 2 * i) for i in range(1, 6)], [])
    fake.log.clear()
    pages = [page async for page in source.snapshot(info, page_size=2)]
    assert [len(p.rows) for p in pages] == [2, 2, 1]
    assert {p.version for p in pages} == {10} and pages[0].total == 5
    assert [r["Id"] for p in pages for r in p.rows] == [1, 2, 3, 4, 5]
    assert pages[0].rows[0] == {"Id": 1, "Price": Decimal("1.00"), "Status": "s", "Doubled": 2}
    kinds = fake.statements()
    assert kinds[:7] == ["READ COMMITTED", "ESTIMATE", "SNAPSHOT", "BEGIN", "CURRENT", "MIN_VALID", "PAGE"]
    assert kinds[kinds.index("COMMIT") - 3 : kinds.index("COMMIT")] == ["PAGE", "PAGE", "PAGE"]
    assert kinds[kinds.index("COMMIT") + 1] == "MIN_VALID"  # still valid after: the catch-up can read
    assert "SNAPSHOT" not in kinds[4:] and "BEGIN" not in kinds[4:]
    assert kinds[-1] == "CLOSE"
    await source.close()


async def test_snapshot_of_an_empty_table_still_gives_its_version(fake: FakeOdbc) -> None:
    source, info = await described(fake)
    pages = [page async for page in source.snapshot(info, page_size=100)]
    assert [(p.version, p.rows) for p in pages] == [(10, [])]
    await source.close()


async def test_an_abandoned_snapshot_rolls_back_and_closes_its_connection(fake: FakeOdbc) -> None:
    source, info = await described(fake)
    put(fake, [(i, "1.00", "s", 2) for i in range(1, 6)], [])
    snapshot = source.snapshot(info, page_size=2)
    await snapshot.__anext__()
    await snapshot.aclose()
    assert fake.statements()[-2:] == ["ROLLBACK", "CLOSE"]
    assert "COMMIT" not in fake.statements()
    await source.close()


# -- shape changes: fingerprints, identity, stale TableInfo, errors of a changed table --------


async def test_fingerprints_of_many_tables_are_one_statement(fake: FakeOdbc) -> None:
    source = MssqlSource(CONFIG, connector=fake.connect)
    others = [
        dataclasses.replace(table_config(), table=f"dbo.Other{i}", name=f"Other{i}", section=f"o{i}")
        for i in range(49)
    ]
    found = await source.fingerprints([table_config(), *others])
    assert found == {"dbo.Forecasts": "object 1000; shape 1", **{t.table: None for t in others}}
    [(text, params)] = [(t, p) for t, p in fake.log if _kind(t) == "FINGERPRINT"]
    assert len(fake.log) == 1  # one round trip: no SET, nothing else
    assert params == ("[dbo].[Forecasts]", *(f"[dbo].[Other{i}]" for i in range(49)))
    assert "Other" not in text and "Forecasts" not in text  # names are parameters, never pasted
    assert await source.fingerprints([]) == {} and len(fake.log) == 1
    await source.close()


async def test_more_tables_than_one_statement_takes_are_asked_about_in_batches(fake: FakeOdbc) -> None:
    source = MssqlSource(CONFIG, connector=fake.connect)
    many = [dataclasses.replace(table_config(), table=f"dbo.T{i}", name=f"T{i}") for i in range(4001)]
    found = await source.fingerprints([*many, table_config()])
    assert [len(p) for t, p in fake.log] == [catalog_sql.FINGERPRINT_BATCH, catalog_sql.FINGERPRINT_BATCH, 2]
    assert list(found) == [t.table for t in many] + ["dbo.Forecasts"]
    assert found["dbo.Forecasts"] == "object 1000; shape 1" and found["dbo.T0"] is None
    await source.close()


async def test_describe_reads_the_fingerprint_first_and_reports_the_object(fake: FakeOdbc) -> None:
    source, info = await described(fake)
    assert fake.statements()[:3] == ["READ COMMITTED", "FINGERPRINT", "CATALOG"]
    assert (info.identity, info.fingerprint, info.left_out) == ("1000", "object 1000; shape 1", ())
    fake.object_id = None  # gone
    with pytest.raises(SchemaError, match=r"dbo\.Forecasts: no such table"):
        await source.describe(table_config())
    await source.close()


RESERVED_COLUMN = (5, "@flag", "bit", "bit", 0, 1, 1, 0, 1, 0)


async def test_reserved_columns_are_left_out_with_a_warning(
    fake: FakeOdbc, caplog: pytest.LogCaptureFixture
) -> None:
    fake.catalog.append(RESERVED_COLUMN)
    with caplog.at_level("WARNING", logger="cdc.sources.mssql"):
        source, info = await described(fake, columns=None)
    assert "@flag" not in info.column_names and info.left_out == ("@flag",)
    [record] = [r for r in caplog.records if r.name == "cdc.sources.mssql"]
    assert (record.table, record.column) == ("dbo.Forecasts", "@flag")  # type: ignore[attr-defined]
    assert "reserved" in record.getMessage()
    put(fake, [(1, "1.00", "a", 2)], [(8, 8, "I", None, 1)])
    [change] = (await source.read_changes(info, 5, limit=10)).rows
    assert set(change.values or {}) == {"Id", "Price", "Status", "Doubled"}  # the read follows the info
    caplog.clear()
    await source.describe(table_config())  # an explicit list: nothing left out, nothing to warn about
    assert not caplog.records
    await source.close()


async def test_a_reserved_primary_key_column_is_refused_by_name(fake: FakeOdbc) -> None:
    fake.catalog[0] = (1, "@id", "int", "int", 0, 4, 10, 0, 0, 0)
    fake.primary_key = [("@id",)]
    with pytest.raises(SchemaError, match=r"dbo\.Forecasts: primary-key column @id .*reserved"):
        await described(fake, columns=None)


async def test_a_read_with_an_outdated_table_info_is_refused_before_reading(fake: FakeOdbc) -> None:
    """A caller still holding the TableInfo of before a change must describe
    the table again: the read neither uses the old shape nor the new one."""
    source, old = await described(fake)
    fake.catalog[2] = (3, "Status", "nvarchar", "nvarchar", 0, 200, 0, 0, 1, 0)  # ALTER COLUMN nvarchar(100)
    fake.fingerprint = "object 1000; shape 2"
    new = await source.describe(table_config())
    assert new != old and new.fingerprint == "object 1000; shape 2"
    fake.log.clear()
    with pytest.raises(
        SchemaError, match=r"dbo\.Forecasts: the table changed since it was described \(column Status"
    ):
        await source.read_changes(old, 5, limit=10)
    with pytest.raises(SchemaError, match="described again"):
        [page async for page in source.snapshot(old, page_size=10)]
    assert "CHANGES" not in fake.statements() and "PAGE" not in fake.statements()
    assert (await source.read_changes(new, 5, limit=10)).next_version == 10  # the new info reads
    await source.close()


@pytest.mark.parametrize(
    ("object_id", "words"),
    [
        (2000, "dropped and created again since it was described (object_id 1000, now 2000)"),
        (None, "is gone"),
    ],
)
async def test_a_read_checks_it_reads_the_table_it_described(
    fake: FakeOdbc, object_id: int | None, words: str
) -> None:
    """OBJECT_ID of the name is read in the read's own transaction, with the
    minimum valid version: a table dropped and created again is another object."""
    source, info = await described(fake)
    fake.object_id = object_id
    fake.log.clear()
    with pytest.raises(SchemaError) as caught:
        await source.read_changes(info, 5, limit=10)
    assert words in str(caught.value) and "described again" in str(caught.value)
    assert fake.statements() == ["SNAPSHOT", "BEGIN", "MIN_VALID", "ROLLBACK"]
    with pytest.raises(SchemaError, match="described again"):
        [page async for page in source.snapshot(info, page_size=10)]
    await source.close()


async def test_mask_column_ids_are_looked_up_by_name_once_in_every_read(fake: FakeOdbc) -> None:
    """CHANGE_TRACKING_IS_COLUMN_IN_MASK takes a column id, and a column
    dropped and added again gets a new one: the ids are read by name from
    sys.columns in the read's own transaction, once per read (not per row and
    column), and passed to every page of it; never an id cached at describe."""
    source, info = await described(fake)
    put(fake, [(i, "1.00", "s", 2) for i in range(1, 6)], [(6, 1, "U", "Price", i) for i in range(1, 6)])
    fake.log.clear()
    page = await source.read_changes(info, 5, limit=2)
    while page.more:
        page = await source.read_changes(info, 5, limit=2, upto=page.next_version, after=page.cursor)
    assert fake.statements().count("COLUMN IDS") == 1
    [(_, params)] = [(t, p) for t, p in fake.log if _kind(t) == "COLUMN IDS"]
    assert params == ("[dbo].[Forecasts]",)
    for text, params in fake.log:
        if _kind(text) in ("CHANGES", "BACKLOG PAGE"):
            assert "COLUMNPROPERTY" not in text and params[1:3] == (2, 3)  # Price's and Status's ids
    # DROP COLUMN Price + ADD COLUMN Price: a new id, which the next read uses
    fake.catalog[1] = (5, "Price", "decimal", "decimal", 0, 9, 12, 2, 1, 0)
    rows = (await source.read_changes(info, 5, limit=10)).rows
    assert {r.changed_columns for r in rows} == {frozenset({"Price", "Doubled"})}
    # a mask column gone (dropped, renamed) before the table is described again: the read says so
    del fake.catalog[1]
    with pytest.raises(SchemaError, match=r"dbo\.Forecasts: column Price is gone.*described again"):
        await source.read_changes(info, 5, limit=10)
    assert fake.statements()[-1] == "ROLLBACK"
    await source.close()


@pytest.mark.parametrize(
    ("native", "text", "error"),
    [
        (207, "Invalid column name 'Status'.", SchemaError),
        (208, "Invalid object name 'dbo.Forecasts'.", SchemaError),
        (22105, "Change tracking is not enabled on table 'dbo.Forecasts'.", TrackingNotEnabled),
    ],
)
async def test_a_read_of_a_table_changed_under_it_fails_for_that_table_only(
    fake: FakeOdbc, native: int, text: str, error: type[Exception]
) -> None:
    source, info = await described(fake)
    fake.fail = lambda sent: (
        pyodbc.ProgrammingError("42000", f"[42000] [FreeTDS][SQL Server]{text} ({native}) (SQLExecDirectW)")
        if "CHANGETABLE" in sent
        else None
    )
    with pytest.raises(error, match=r"^dbo\.Forecasts: .*described again"):
        await source.read_changes(info, 5, limit=10)
    assert fake.statements()[-2:] == ["CHANGES", "ROLLBACK"]  # rolled back; the connection kept
    fake.fail = lambda sent: None
    assert (await source.read_changes(info, 5, limit=10)).next_version == 10
    assert fake.connections == 2  # describe's and the one reader's
    await source.close()


async def test_a_value_its_described_type_cannot_read_after_alter_column_is_a_schema_error(
    fake: FakeOdbc,
) -> None:
    """ALTER COLUMN Price nvarchar(20) between two fingerprint polls (the
    fingerprint now differs): the read names the column, and the table is
    described again, instead of failing with a ValueError."""
    source, info = await described(fake)
    put(fake, [(1, "twelve", "x", 2), (2, "2.00", "y", 4)], [(8, 8, "I", None, 1), (9, 9, "I", None, 2)])
    fake.fingerprint = "object 1000; shape 2 (Price nvarchar(20))"
    for limit in (10, 1):  # the whole read in one page, or a page with more to come (held open)
        with pytest.raises(
            SchemaError,
            match=r"dbo\.Forecasts: column Price: decimal\(12,2\) value 'twelve' cannot be read.*described again",
        ):
            await source.read_changes(info, 5, limit=limit)
        assert fake.statements()[-1] == "ROLLBACK"
    with pytest.raises(SchemaError, match="column Price"):
        [page async for page in source.snapshot(info, page_size=10)]
    fake.db.execute("""UPDATE dbo."Forecasts" SET "Price" = '12.00' WHERE "Id" = 1""")
    assert len((await source.read_changes(info, 5, limit=10)).rows) == 2
    assert fake.connections == 3  # describe's, the one reader's (given back each time), the snapshot's
    await source.close()


async def test_a_value_its_converter_cannot_read_in_a_table_as_described_is_that_rows_poison(
    fake: FakeOdbc,
) -> None:
    """The shape is the one described: the row goes to the dead letter (the
    mapper raises PoisonChange naming table and column), the read goes on, and
    its transaction is committed, not left open."""
    source, info = await described(fake)
    put(
        fake,
        [(1, "twelve", "x", 2), (2, "2.00", "y", 4), (3, "3.00", "z", 6)],
        [(8, 8, "I", None, 1), (9, 9, "I", None, 2), (9, 9, "I", None, 3)],
    )
    mapper = TableMapper(table_config(), info, max_row_bytes=1 << 20)
    page = await source.read_changes(info, 5, limit=2)  # the unreadable row on a page with more to come
    assert page.more and [r.key["Id"] for r in page.rows] == [1, 2]
    with pytest.raises(PoisonChange, match=r"^column Price: decimal\(12,2\) value 'twelve' cannot be read"):
        mapper.from_row(page.rows[0])
    assert mapper.from_row(page.rows[1]) is not None
    rest = await source.read_changes(info, 5, limit=2, upto=page.next_version, after=page.cursor)
    assert [r.key["Id"] for r in rest.rows] == [3] and not rest.more
    assert "ROLLBACK" not in fake.statements() and fake.statements()[-2:] == ["COMMIT", "DROP BACKLOG"]
    snapshot = [row for page in [p async for p in source.snapshot(info, page_size=10)] for row in page.rows]
    assert [row["Id"] for row in snapshot] == [1, 2, 3]
    with pytest.raises(PoisonChange, match="column Price"):
        mapper.from_snapshot(snapshot[0], version=10)
    await source.close()


async def test_a_page_that_cannot_be_decoded_gives_its_reader_back_rolled_back(fake: FakeOdbc) -> None:
    """Whatever fails while a page is decoded, the read's transaction is not left open."""
    source, info = await described(fake)
    put(fake, [(i, "1.00", "s", 2) for i in range(1, 5)], [(6, 1, "X", None, i) for i in range(1, 5)])
    with pytest.raises(ValueError, match="SYS_CHANGE_OPERATION 'X'"):
        await source.read_changes(info, 5, limit=2)
    assert fake.statements()[-1] == "ROLLBACK" and "COMMIT" not in fake.statements()
    fake.db.execute("UPDATE ct_src SET SYS_CHANGE_OPERATION = 'U'")
    assert len((await source.read_changes(info, 5, limit=10)).rows) == 4
    assert fake.connections == 2  # the reader was given back, not lost
    await source.close()


async def test_a_read_cancelled_between_pages_is_rolled_back_and_its_reader_given_back(
    fake: FakeOdbc,
) -> None:
    """The tracker is cancelled (shutdown, a lost lease) while it feeds a page
    to Redis: the held SNAPSHOT transaction must not stay open (tempdb)."""
    source, info = await described(fake)
    put(fake, [(i, "1.00", "s", 2) for i in range(1, 5)], [(6, 1, "U", None, i) for i in range(1, 5)])
    first_page = asyncio.Event()

    async def tracker() -> None:
        assert (await source.read_changes(info, 5, limit=2)).more
        first_page.set()
        await asyncio.Event().wait()  # feeding the page to Redis, until cancelled

    task = asyncio.create_task(tracker())
    await asyncio.wait_for(first_page.wait(), 5)
    [reader] = {n for kind, n in fake.trail if kind == "CHANGES"}
    task.cancel()

    async def rolled_back() -> bool:
        return ("ROLLBACK", reader) in fake.trail

    await wait_for(rolled_back, 5, "the held read's rollback")
    assert "COMMIT" not in fake.statements()
    assert (await source.read_changes(info, 5, limit=10)).next_version == 10
    assert fake.connections == 2  # the reader was given back and read again
    await source.close()


async def test_a_read_not_continued_in_time_is_rolled_back(
    fake: FakeOdbc, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mssql_held, "HOLD_LIMIT", 0.05)
    source, info = await described(fake)
    put(fake, [(i, "1.00", "s", 2) for i in range(1, 5)], [(6, 1, "U", None, i) for i in range(1, 5)])
    page = await source.read_changes(info, 5, limit=2)  # this task lives on, and does not continue

    async def rolled_back() -> bool:
        return fake.statements()[-1] == "ROLLBACK"

    await wait_for(rolled_back, 5, "the idle held read's rollback")
    # a late continuation still gets the rest: a new transaction from (upto, after)
    rest = await source.read_changes(info, 5, limit=2, upto=page.next_version, after=page.cursor)
    assert [r.key["Id"] for r in page.rows + rest.rows] == [1, 2, 3, 4]
    assert fake.connections == 2
    await source.close()


async def test_tracking_status_has_no_minimum_version_unless_the_table_is_tracked(fake: FakeOdbc) -> None:
    source = MssqlSource(CONFIG, connector=fake.connect)
    other = dataclasses.replace(table_config(), table="dbo.Gone", name="Gone")
    tracked, gone = await source.tracking_status([table_config(), other])
    assert [_kind(t) for t, _ in fake.log].count("STATES") == 1  # one statement for every table
    assert (tracked.enabled, tracked.min_valid_version) == (True, 0)
    assert (gone.enabled, gone.min_valid_version) == (False, None) and "no such table" in gone.detail
    fake.tracking = []  # turned off, or created again and not enabled yet
    [off] = await source.tracking_status([table_config()])
    assert (off.enabled, off.min_valid_version) == (False, None)
    assert "`cdc tracking enable --table dbo.Forecasts`" in off.detail
    await source.close()


# -- tracking set-up, status, doctor ------------------------------------------------


async def test_enable_sets_everything_that_is_off(fake: FakeOdbc) -> None:
    fake.database = ("CdcDemo", 0, "OFF", None, None, None, None)
    fake.tracking = []
    source = MssqlSource(CONFIG, connector=fake.connect)
    done = await source.tracking_enable([table_config()])
    alters = [text for text, _ in fake.log if text.startswith("ALTER")]
    assert alters == [
        "ALTER DATABASE CURRENT SET ALLOW_SNAPSHOT_ISOLATION ON",
        "ALTER DATABASE CURRENT SET CHANGE_TRACKING = ON (CHANGE_RETENTION = 2 DAYS, AUTO_CLEANUP = ON)",
        "ALTER TABLE [dbo].[Forecasts] ENABLE CHANGE_TRACKING WITH (TRACK_COLUMNS_UPDATED = ON)",
    ]
    assert any("dbo.Forecasts" in line for line in done)
    await source.close()


async def test_enable_lengthens_a_short_retention_and_leaves_tracked_tables(fake: FakeOdbc) -> None:
    fake.database = ("CdcDemo", 1, "ON", 10, 12, 2, 1)  # 12 HOURS
    source = MssqlSource(CONFIG, connector=fake.connect)
    done = await source.tracking_enable([table_config()])
    alters = [text for text, _ in fake.log if text.startswith("ALTER")]
    assert alters == ["ALTER DATABASE CURRENT SET CHANGE_TRACKING (CHANGE_RETENTION = 2 DAYS)"]
    assert "dbo.Forecasts: already tracked" in done
    await source.close()


async def test_enable_on_a_table_without_primary_key_names_it(fake: FakeOdbc) -> None:
    fake.tracking = []
    fake.fail = lambda text: (
        pyodbc.ProgrammingError(
            "42000",
            "[42000] [FreeTDS][SQL Server]Cannot enable change tracking on table 'Forecasts'. Change tracking "
            "requires a primary key on the table. (4997) (SQLExecDirectW)",
        )
        if text.startswith("ALTER TABLE")
        else None
    )
    source = MssqlSource(CONFIG, connector=fake.connect)
    with pytest.raises(SchemaError, match=r"dbo\.Forecasts.*primary key"):
        await source.tracking_enable([table_config()])
    await source.close()


async def test_status_and_disable(fake: FakeOdbc) -> None:
    source = MssqlSource(CONFIG, connector=fake.connect)
    [status] = await source.tracking_status([table_config()])
    assert status.enabled and status.current_version == 10 and status.min_valid_version == 0
    assert "TRACK_COLUMNS_UPDATED = ON" in status.detail
    done = await source.tracking_disable([table_config()])
    assert "ALTER TABLE [dbo].[Forecasts] DISABLE CHANGE_TRACKING" in [t for t, _ in fake.log]
    assert done[0] == "dbo.Forecasts: change tracking disabled"
    assert await source.cleanup(3600) == 0
    await source.close()


async def test_doctor_finds_what_will_go_wrong(fake: FakeOdbc) -> None:
    fake.database = ("CdcDemo", 0, "OFF", 10, 30, 1, 0)  # snapshot off, 30 minutes, no cleanup
    fake.permissions = (1, 0)
    fake.tracking = [(0, 0)]
    source = MssqlSource(CONFIG, connector=fake.connect)
    findings = await source.doctor([table_config()])
    text = [(f.level, f.subject, f.message) for f in findings]
    assert ("error", "snapshot isolation") in [(lv, s) for lv, s, _ in text]
    assert any(lv == "warning" and "30 MINUTES" in m for lv, _, m in text)
    assert any(lv == "warning" and "AUTO_CLEANUP is OFF" in m for lv, _, m in text)
    assert any(lv == "error" and "VIEW CHANGE TRACKING" in m and "GRANT" in m for lv, _, m in text)
    assert any(lv == "warning" and "TRACK_COLUMNS_UPDATED is OFF" in m for lv, _, m in text)
    await source.close()


async def test_doctor_notices_a_schema_change(fake: FakeOdbc) -> None:
    source, _ = await described(fake)
    fake.catalog[1] = (2, "Price", "decimal", "decimal", 0, 13, 18, 4, 1, 0)
    findings = await source.doctor([table_config()])
    assert any(f.level == "warning" and "changed" in f.message for f in findings)
    await source.close()


async def test_wait_for_changes_sleeps_and_reports_nothing() -> None:
    source = MssqlSource(CONFIG, connector=FakeOdbc().connect)
    loop = asyncio.get_running_loop()
    start = loop.time()
    assert await source.wait_for_changes(0.05) == set()
    assert loop.time() - start >= 0.04
    await source.close()


# -- the docker compose demo (it cannot run here: its files are checked instead) -----

ROOT = Path(__file__).resolve().parents[3]  # tests/cdc/sources/ -> the checkout
DEMO_ENV = {
    "CDC_SOURCE_DSN": "DRIVER=FreeTDS;SERVER=mssql;PORT=1433;DATABASE=CdcDemo;UID=cdc_sidecar;PWD=x;TDS_Version=7.4",
    "CDC_REDIS_URL": "redis://redis:6379/0",
}


def init_batches() -> list[str]:
    """docker/mssql-init.sql split into sqlcmd batches, its $(CDC_PASSWORD) variable filled in."""
    text = (ROOT / "docker" / "mssql-init.sql").read_text().replace("$(CDC_PASSWORD)", "pw")
    return [b for b in re.split(r"(?im)^\s*GO\s*$", text) if b.strip()]


def test_the_init_script_parses_and_sets_everything_up() -> None:
    trees = [
        tree for batch in init_batches() for tree in sqlglot.parse(batch, read="tsql") if tree is not None
    ]
    text = " ".join(" ".join(b.split()) for b in init_batches())
    for needed in (
        "CREATE DATABASE CdcDemo",
        "ALTER DATABASE CdcDemo SET ALLOW_SNAPSHOT_ISOLATION ON",
        "ALTER DATABASE CdcDemo SET CHANGE_TRACKING = ON (CHANGE_RETENTION = 2 DAYS, AUTO_CLEANUP = ON)",
        "ALTER TABLE dbo.Forecasts ENABLE CHANGE_TRACKING WITH (TRACK_COLUMNS_UPDATED = ON)",
        "CREATE LOGIN cdc_sidecar WITH PASSWORD = N'pw'",
        "CREATE USER cdc_sidecar FOR LOGIN cdc_sidecar",
        "GRANT SELECT ON dbo.Forecasts TO cdc_sidecar",
        "GRANT VIEW CHANGE TRACKING ON dbo.Forecasts TO cdc_sidecar",
    ):
        assert needed in text
    [create] = [c for t in trees for c in t.find_all(exp.Create) if c.kind == "TABLE"]
    assert create.this.this.name == "Forecasts"
    columns = [c.name for c in create.find_all(exp.ColumnDef)]
    assert columns == ["Id", "RegionId", "Price", "ValidFrom", "ValidTo", "Status"]
    assert "PRIMARY KEY" in create.sql("tsql")


def test_the_demo_config_loads_and_matches_the_init_script() -> None:
    config = load_config(ROOT / "docker" / "tables.yaml", environ=DEMO_ENV)
    assert config.source.kind == "mssql" and config.source.dsn == DEMO_ENV["CDC_SOURCE_DSN"]
    assert config.redis.url == "redis://redis:6379/0"
    assert config.worker.health == ("0.0.0.0", 9478)
    [table] = config.tables
    assert table.table == "dbo.Forecasts" and table.section == "forecasts"
    assert table.columns == ("Id", "RegionId", "Price", "ValidFrom", "ValidTo", "Status")
    assert table.key is not None and table.key.columns == ("Id",)  # templates use primary-key columns only


def test_compose_wires_sql_server_redis_the_init_job_and_the_sidecar() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert set(services) == {"mssql", "mssql-init", "redis", "cdc"}
    mssql = services["mssql"]
    assert mssql["image"] == "mcr.microsoft.com/mssql/server:2022-latest"
    assert mssql["environment"]["ACCEPT_EULA"] == "Y"
    assert mssql["environment"]["MSSQL_SA_PASSWORD"].startswith("${MSSQL_SA_PASSWORD:-")
    health = " ".join(mssql["healthcheck"]["test"])
    assert "/opt/mssql-tools18/bin/sqlcmd -C" in health and "$$MSSQL_SA_PASSWORD" in health
    init = services["mssql-init"]
    assert init["depends_on"] == {"mssql": {"condition": "service_healthy"}}
    assert "./docker/mssql-init.sql:/init/mssql-init.sql:ro" in init["volumes"]
    command = " ".join(init["entrypoint"])
    assert "/opt/mssql-tools18/bin/sqlcmd -C -S mssql" in command and "-i /init/mssql-init.sql" in command
    assert "-b" in command.split() and "CDC_PASSWORD=" in command
    assert services["redis"]["image"] == "redis:7" and "noeviction" in services["redis"]["command"]
    cdc = services["cdc"]
    assert cdc["build"] == "."
    assert cdc["depends_on"] == {
        "mssql-init": {"condition": "service_completed_successfully"},
        "redis": {"condition": "service_healthy"},
    }
    assert {"CDC_SOURCE_DSN", "CDC_REDIS_URL"} <= set(cdc["environment"])
    dsn = parse_dsn(cdc["environment"]["CDC_SOURCE_DSN"])
    assert (dsn["DRIVER"], dsn["SERVER"], dsn["DATABASE"], dsn["UID"]) == (
        "FreeTDS",
        "mssql",
        "CdcDemo",
        "cdc_sidecar",
    )
    assert dsn["PWD"] == "${CDC_MSSQL_PASSWORD:-Local-Only-Cdc-Passw0rd}"
    assert init["environment"]["CDC_MSSQL_PASSWORD"] == dsn["PWD"]  # the login the init script creates
    mount = "./docker/tables.yaml:/etc/cdc/tables.yaml:ro"
    assert mount in cdc["volumes"]
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert 'CMD ["run"]' in dockerfile and "ENV CDC_CONFIG=/etc/cdc/tables.yaml" in dockerfile


def test_the_dockerfile() -> None:
    text = (ROOT / "Dockerfile").read_text()
    stages = re.findall(r"(?m)^FROM (\S+)", text)
    assert stages == ["python:3.11-slim", "python:3.11-slim"]  # multi-stage: wheels, then the runtime
    assert "pip wheel --wheel-dir /wheels ." in text
    assert re.search(r"apt-get install -y --no-install-recommends unixodbc tdsodbc", text)
    user = re.findall(r"(?m)^USER (\S+)", text)
    assert user and user[-1].split(":")[0] not in ("root", "0")
    health = re.search(r"(?m)^HEALTHCHECK .*\n\s+CMD (.*)$", text)
    # `cdc health` probes the config's worker.health (tests/deploy/test_image.py runs it)
    assert health and health.group(1).startswith('["sh", "-c", "cdc health ')
    assert "curl" not in text.split("HEALTHCHECK")[1]
    assert 'ENTRYPOINT ["cdc"]' in text
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".git", ".venv", "tests"} <= set(ignored)


# -- the contract suite's SQL Server harness (tests/contract/harness.py) -------------


class _Recorder:
    """Stands in for the harness's connections: records the T-SQL it would send."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, tuple[Any, ...]]] = []

    async def execute(self, statement: str, *params: Any) -> int:
        self.sent.append((statement, params))
        return 1

    def __call__(self, statement: str, *params: Any) -> Any:  # conn.execute(...)
        self.sent.append((statement, params))
        return self

    def fetchone(self) -> tuple[Any, ...]:
        return (0, None)  # snapshot isolation off, change tracking off

    def fetchall(self) -> list[tuple[Any, ...]]:
        return [("items",)]


async def test_the_contract_harness_sends_t_sql_that_parses() -> None:
    """The harness runs only against a real SQL Server; here its statements are
    at least parsed, and their placeholders counted against their parameters."""
    from tests.contract import harness as contract

    recorder = _Recorder()
    mssql = contract.MssqlHarness("DRIVER={FreeTDS};SERVER=nowhere", "cabc", recorder)  # type: ignore[arg-type]
    table = await mssql.create_table("items", {"id": "int", "n": "int", "note": "text"}, ["id"], track=False)
    await mssql.create_table("keyless", {"id": "int", "doc": "sql_variant"}, [], track=False)
    await mssql.insert_literals(table, {"id": "1", "note": "N'x'"})
    await mssql.truncate(table)
    writer = contract.MssqlWriter("DRIVER={FreeTDS};SERVER=nowhere", mssql.keys)
    writer.session = recorder  # type: ignore[assignment]
    await writer.insert(table, {"id": 1, "n": 2, "note": "a"})
    await writer.upsert(table, {"id": 1, "n": 3, "note": "b"})
    await writer.update(table, {"id": 1}, {"n": 4})
    await writer.delete(table, {"id": 1})
    await writer.move(table, {"id": 1}, {"id": 2})
    conn = type("Conn", (), {"execute": lambda self, s, *p: recorder(s, *p)})()
    contract._mssql_database_setup(conn)
    contract._mssql_drop_schema(conn, "cabc")
    for case in mssql.type_cases():  # every literal is an expression SQL Server takes
        recorder.sent.append((f"SELECT {case.literal}", ()))
    assert (
        "CREATE TABLE [cabc].[items] ([id] int NOT NULL, [n] int, [note] nvarchar(400), PRIMARY KEY ([id]))"
        in [s for s, _ in recorder.sent]
    )
    for statement, params in recorder.sent:
        if statement.startswith("ALTER DATABASE"):
            continue  # no sqlglot grammar: the text is sql.ENABLE_SNAPSHOT_ISOLATION's and enable_database_tracking's
        tree = parse(statement)
        assert placeholders(tree) == len(params), statement
