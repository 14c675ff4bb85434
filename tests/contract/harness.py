"""Harnesses for the ChangeSource contract suite.

The contract (DESIGN.md §2, ``cdc.sources.base``) is the same for every
source, so its tests are written once, against ``SourceHarness``: a database
of one dialect with a ``ChangeSource`` reading it. A harness creates tables
from a small column spec (logical types), writes to them in its dialect
(``Writer``: one open transaction on a connection of its own, so tests can
interleave concurrent transactions), reads a table's actual contents, and
forces the events that invalidate checkpoints (retention cleanup, TRUNCATE).
Everything dialect-specific stays in the harness: SQL text, type names, the
type round-trip cases.

To add a source: subclass ``SourceHarness`` and ``Writer``, and register a
factory in ``HARNESSES`` (it receives the pytest request, to reach the fixtures
it needs, and skips the test where its server is missing). The helpers at the
end (``read_all``, ``Replica``) are dialect-free.

Key types (``test_key_types``): the logical types ``timestamp``,
``timestamptz``, ``uuid``, ``ctext`` and ``cvarchar`` (text under collations
that are not the database's default, whose order is not the text's code-point
order) map to each dialect's own (``tests/contract/key_values.py`` has their
values); a harness that cannot express one skips its tests with the reason.
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
import datetime as dt
import decimal
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import psycopg
import pyodbc
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg.rows import TupleRow

from cdc.config import SourceConfig, TableConfig
from cdc.sources import mssql_sql
from cdc.sources.base import ChangeRow, ChangeSource, SnapshotPage, TableInfo
from cdc.sources.memory import MemorySource, MemoryTransaction
from cdc.sources.mssql import MssqlSource
from cdc.sources.mssql_dsn import parse_dsn
from cdc.sources.mssql_types import register_converters
from cdc.sources.pg_tracking import net_table_name
from cdc.sources.postgres import PostgresSource
from cdc.sources.postgres_logical import PostgresLogicalSource
from cdc.templates import Template

from .key_values import MEMORY_KEYS, MSSQL_KEYS, PG_KEYS, KeyValues

Key = tuple[Any, ...]
T = TypeVar("T")


@dataclass(frozen=True)
class TypeCase:
    """One column type: a value written as a SQL expression of the dialect, and
    the JSON text ``cdc.values.encode_value`` must make of what the source reads."""

    column: str
    column_type: str
    literal: str
    expected: bytes


def make_table_config(schema: str, name: str, columns: Sequence[str] | None = None) -> TableConfig:
    return TableConfig(
        table=f"{schema}.{name}",
        schema=schema,
        name=name,
        section=name,
        partition=Template.parse(name),
        key=None,
        columns=tuple(columns) if columns is not None else None,
    )


class Writer(abc.ABC):
    """One transaction, open until ``commit`` or ``rollback``."""

    @abc.abstractmethod
    async def take_version(self) -> None:
        """Make the transaction take what orders its changes now, long before it commits
        (PostgreSQL: its transaction id)."""

    @abc.abstractmethod
    async def insert(self, table_config: TableConfig, row: Mapping[str, Any]) -> None: ...

    @abc.abstractmethod
    async def upsert(self, table_config: TableConfig, row: Mapping[str, Any]) -> None:
        """Insert the row, or update every given column where the key exists."""

    @abc.abstractmethod
    async def update(
        self, table_config: TableConfig, key: Mapping[str, Any], values: Mapping[str, Any]
    ) -> None: ...

    @abc.abstractmethod
    async def delete(self, table_config: TableConfig, key: Mapping[str, Any]) -> None: ...

    @abc.abstractmethod
    async def move(
        self, table_config: TableConfig, key: Mapping[str, Any], new_key: Mapping[str, Any]
    ) -> None:
        """Update the primary key of a row, if the row exists and the new key is free."""

    @abc.abstractmethod
    async def commit(self) -> None: ...

    @abc.abstractmethod
    async def rollback(self) -> None: ...


class SourceHarness(abc.ABC):
    kind: str
    source: ChangeSource
    # a column type the source must refuse to publish (None: every type a test can create is mirrored)
    unsupported_type: str | None
    # whether an update's changed columns are known (logical decoding: None, the WAL has no old values)
    knows_changed_columns: bool = True
    # whether a read's rows of one version come in the database's key order (its collations);
    # logical decoding sorts them in memory, by the values' Python order (its cursors follow it)
    orders_changes_by_database_key: bool = True

    @abc.abstractmethod
    async def create_table(
        self,
        name: str,
        columns: Mapping[str, str],
        key: Sequence[str],
        *,
        published: Sequence[str] | None = None,
        track: bool = True,
    ) -> TableConfig:
        """Create ``name`` with ``columns`` and primary ``key`` (may be empty), enable
        tracking and settle. A column's type is a logical one (int, bigint, text,
        decimal = decimal(12,2), float, bool) or else the dialect's own."""

    @abc.abstractmethod
    async def begin(self) -> Writer: ...

    @abc.abstractmethod
    async def rows(self, table_config: TableConfig) -> dict[Key, dict[str, Any]]:
        """The table's committed contents: primary-key values -> every column."""

    @abc.abstractmethod
    async def insert_literals(self, table_config: TableConfig, row: Mapping[str, str]) -> None:
        """Insert one row given as SQL expressions of the dialect."""

    @abc.abstractmethod
    async def truncate(self, table_config: TableConfig) -> None: ...

    @abc.abstractmethod
    async def expire_tracking(self, table_config: TableConfig) -> None:
        """Run retention cleanup so that every change tracked so far is removed."""

    @abc.abstractmethod
    def type_cases(self) -> Sequence[TypeCase]: ...

    @abc.abstractmethod
    async def settle(self) -> None:
        """Return once every transaction committed so far lies within a read's
        bound. Immediate where commits are readable at once; where other open
        transactions hold the bound back (PostgreSQL), a wait with a deadline."""

    @abc.abstractmethod
    async def key_values(self, kind: str) -> KeyValues:
        """Distinct values of the logical key type ``kind``; skips the test, with
        the reason, where the dialect (or this server) cannot express it."""

    @abc.abstractmethod
    async def insert_literal_rows(self, table_config: TableConfig, rows: Sequence[Mapping[str, str]]) -> None:
        """Insert the rows (SQL expressions of the dialect, the same columns in
        each) in ONE transaction, so they share a version; then settle."""

    @abc.abstractmethod
    async def ids_in_key_order(self, table_config: TableConfig, id_column: str) -> list[Any]:
        """``id_column`` of every committed row, in the order the database sorts
        the table's primary key (its ORDER BY: collations, uniqueidentifier...)."""

    @abc.abstractmethod
    async def open_transactions(self) -> int | None:
        """How many sessions of this harness's sources hold a transaction open on
        the server now; None where a source has no transaction to hold."""

    @abc.abstractmethod
    def another_source(self) -> AbstractAsyncContextManager[ChangeSource]:
        """A second source, connected, on the same database and tracking, holding
        no read of its own: a read continued there starts afresh from its
        ``(upto, after)`` cursor, as after a reconnect or a restart."""

    @asynccontextmanager
    async def writer(self) -> AsyncIterator[Writer]:
        """A transaction committed at the end of the block (rolled back on error),
        and settled: a read right after the block sees it."""
        writer = await self.begin()
        try:
            yield writer
        except BaseException:
            await writer.rollback()
            raise
        await writer.commit()
        await self.settle()


# -- PostgreSQL ----------------------------------------------------------------

_PG_TYPES = {
    "int": "integer",
    "bigint": "bigint",
    "text": "text",
    "decimal": "numeric(12,2)",
    "float": "double precision",
    "bool": "boolean",
    "timestamp": "timestamp(6)",
    "timestamptz": "timestamptz",
    "uuid": "uuid",
    # ICU collations (the test server's database is initdb'ed with --locale=C)
    "ctext": 'text collate "und-x-icu"',
    "cvarchar": 'varchar(100) collate "sv-x-icu"',
}
_PG_COLLATIONS = {"ctext": "und-x-icu", "cvarchar": "sv-x-icu"}

_PG_CASES = (
    TypeCase("c_smallint", "smallint", "-32768", b"-32768"),
    TypeCase("c_int", "integer", "2147483647", b"2147483647"),
    TypeCase("c_bigint", "bigint", "9223372036854775807", b"9223372036854775807"),
    TypeCase("c_numeric", "numeric(20,4)", "12345678901234.5600", b'"12345678901234.5600"'),
    TypeCase("c_numeric_free", "numeric", "-0.000125", b'"-0.000125"'),
    TypeCase("c_real", "real", "1.5", b"1.5"),
    TypeCase("c_double", "double precision", "0.1", b"0.1"),
    TypeCase("c_bool", "boolean", "true", b"true"),
    TypeCase("c_text", "text", "E'h\\u00e9llo \"w\\u00f6rld\"\\n'", '"héllo \\"wörld\\"\\n"'.encode()),
    TypeCase("c_varchar", "varchar(10)", "'abc'", b'"abc"'),
    TypeCase("c_char", "char(4)", "'ab'", b'"ab  "'),
    TypeCase("c_bytea", "bytea", "'\\x00ff10'::bytea", b'"AP8Q"'),
    TypeCase(
        "c_uuid",
        "uuid",
        "'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11'",
        b'"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"',
    ),
    TypeCase("c_date", "date", "'2024-02-29'", b'"2024-02-29"'),
    TypeCase("c_date_infinity", "date", "'infinity'", b'"infinity"'),
    TypeCase("c_time", "time", "'13:45:30.125'", b'"13:45:30.125000"'),
    TypeCase("c_timestamp", "timestamp", "'2024-02-29 13:45:30.5'", b'"2024-02-29T13:45:30.500000"'),
    TypeCase("c_timestamptz", "timestamptz", "'2024-02-29 13:45:30+02'", b'"2024-02-29T11:45:30+00:00"'),
    TypeCase("c_interval", "interval", "'1 year 2 months 3 days 04:05:06.5'", b'"P1Y2M3DT4H5M6.5S"'),
    # JSON as PostgreSQL prints it: json keeps the text as written, jsonb prints its own form
    TypeCase("c_json", "json", '\'{"b": 1, "a": [1.5, null, "x"]}\'', b'{"b": 1, "a": [1.5, null, "x"]}'),
    TypeCase("c_jsonb", "jsonb", '\'{"bb": 1, "a": {"c": true}}\'', b'{"a": {"c": true}, "bb": 1}'),
    TypeCase("c_int_array", "integer[]", "'{1,2,NULL}'", b"[1,2,null]"),
    TypeCase("c_text_array", "text[]", "'{\"a b\",c}'", b'["a b","c"]'),
    TypeCase("c_numeric_array", "numeric[]", "'{1.10,2}'", b'["1.10","2"]'),
    TypeCase("c_timestamp_array", "timestamp[]", "'{2024-01-01 00:00:00}'", b'["2024-01-01T00:00:00"]'),
)


class PostgresWriter(Writer):
    def __init__(self, conn: psycopg.AsyncConnection[TupleRow], keys: Mapping[str, tuple[str, ...]]) -> None:
        self.conn = conn  # not autocommit: the first statement begins the transaction
        self.keys = keys  # table name -> primary key

    async def take_version(self) -> None:
        await self.conn.execute("select pg_current_xact_id()")

    async def insert(self, table_config: TableConfig, row: Mapping[str, Any]) -> None:
        await self.conn.execute(_insert(table_config, row), list(row.values()))

    async def upsert(self, table_config: TableConfig, row: Mapping[str, Any]) -> None:
        key = self.keys[table_config.name]
        updates = [c for c in row if c not in key]
        query = sql.SQL("{} on conflict ({}) do update set {}").format(
            _insert(table_config, row),
            sql.SQL(", ").join(map(sql.Identifier, key)),
            sql.SQL(", ").join(sql.SQL("{0} = excluded.{0}").format(sql.Identifier(c)) for c in updates),
        )
        await self.conn.execute(query, list(row.values()))

    async def update(
        self, table_config: TableConfig, key: Mapping[str, Any], values: Mapping[str, Any]
    ) -> None:
        query = sql.SQL("update {} set {} where {}").format(
            _name(table_config), _pairs(values, ", "), _pairs(key)
        )
        await self.conn.execute(query, [*values.values(), *key.values()])

    async def delete(self, table_config: TableConfig, key: Mapping[str, Any]) -> None:
        await self.conn.execute(
            sql.SQL("delete from {} where {}").format(_name(table_config), _pairs(key)), list(key.values())
        )

    async def move(
        self, table_config: TableConfig, key: Mapping[str, Any], new_key: Mapping[str, Any]
    ) -> None:
        query = sql.SQL("update {0} set {1} where {2} and not exists (select from {0} where {3})").format(
            _name(table_config), _pairs(new_key, ", "), _pairs(key), _pairs(new_key)
        )
        await self.conn.execute(query, [*new_key.values(), *key.values(), *new_key.values()])

    async def commit(self) -> None:
        await self.conn.commit()
        await self.conn.close()

    async def rollback(self) -> None:
        await self.conn.rollback()
        await self.conn.close()


def _name(table_config: TableConfig) -> sql.Identifier:
    return sql.Identifier(table_config.schema, table_config.name)


def _pairs(values: Mapping[str, Any], separator: str = " and ") -> sql.Composed:
    return sql.SQL(separator).join(sql.SQL("{} = %s").format(sql.Identifier(c)) for c in values)


def _insert(table_config: TableConfig, row: Mapping[str, Any]) -> sql.Composed:
    return sql.SQL("insert into {} ({}) values ({})").format(
        _name(table_config),
        sql.SQL(", ").join(map(sql.Identifier, row)),
        sql.SQL(", ").join(sql.Placeholder() * len(row)),
    )


class PostgresHarness(SourceHarness):
    kind = "postgres"
    unsupported_type = "regclass"

    def __init__(self, dsn: str, schema: str, admin: psycopg.AsyncConnection[TupleRow]) -> None:
        self.dsn = dsn
        self.schema = schema
        self.tracking_schema = f"{schema}_cdc"
        self.admin = admin  # autocommit, for DDL and reading contents
        self.keys: dict[str, tuple[str, ...]] = {}
        self.writers: list[PostgresWriter] = []  # closed at teardown, should a test fail midway
        # the sources' sessions, told apart in pg_stat_activity from every other test's
        self.application_name = f"contract-{uuid.uuid4().hex[:10]}"
        self.source_config = SourceConfig(
            kind="postgres",
            dsn=make_conninfo(dsn, application_name=self.application_name),
            tracking_schema=self.tracking_schema,
        )
        self.pg_source = PostgresSource(self.source_config)
        self.source = self.pg_source

    @classmethod
    @asynccontextmanager
    async def running(cls, request: pytest.FixtureRequest) -> AsyncIterator[SourceHarness]:
        dsn, schema = request.getfixturevalue("postgres_dsn"), request.getfixturevalue("pg_schema")
        admin = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        harness = cls(dsn, schema, admin)
        try:
            await harness.source.connect()
            yield harness
        finally:
            for writer in harness.writers:
                await writer.conn.close()
            await harness.source.close()
            await admin.execute(
                sql.SQL("drop schema if exists {} cascade").format(sql.Identifier(harness.tracking_schema))
            )
            await admin.close()

    async def create_table(
        self,
        name: str,
        columns: Mapping[str, str],
        key: Sequence[str],
        *,
        published: Sequence[str] | None = None,
        track: bool = True,
    ) -> TableConfig:
        table_config = make_table_config(self.schema, name, published)
        definitions = [
            sql.SQL("{} {}").format(sql.Identifier(column), sql.SQL(_PG_TYPES.get(kind, kind)))
            for column, kind in columns.items()
        ]
        if key:
            definitions.append(
                sql.SQL("primary key ({})").format(sql.SQL(", ").join(map(sql.Identifier, key)))
            )
        await self.admin.execute(
            sql.SQL("create table {} ({})").format(_name(table_config), sql.SQL(", ").join(definitions))
        )
        self.keys[name] = tuple(key)
        if track:
            await self.source.tracking_enable([table_config])
            await self.settle()  # a snapshot now is above the start of tracking
        return table_config

    async def begin(self) -> Writer:
        writer = PostgresWriter(await psycopg.AsyncConnection.connect(self.dsn), self.keys)
        self.writers = [w for w in self.writers if not w.conn.closed] + [writer]
        return writer

    async def rows(self, table_config: TableConfig) -> dict[Key, dict[str, Any]]:
        cur = await self.admin.execute(sql.SQL("select * from {}").format(_name(table_config)))
        names = [d.name for d in cur.description or ()]
        contents = [dict(zip(names, r, strict=True)) for r in await cur.fetchall()]
        return {tuple(r[k] for k in self.keys[table_config.name]): r for r in contents}

    async def insert_literals(self, table_config: TableConfig, row: Mapping[str, str]) -> None:
        await self.admin.execute(
            sql.SQL("insert into {} ({}) values ({})").format(
                _name(table_config),
                sql.SQL(", ").join(map(sql.Identifier, row)),
                sql.SQL(", ").join(map(sql.SQL, row.values())),
            )
        )
        await self.settle()

    async def truncate(self, table_config: TableConfig) -> None:
        await self.admin.execute(sql.SQL("truncate table {}").format(_name(table_config)))

    async def expire_tracking(self, table_config: TableConfig) -> None:
        """Age the table's entries past a one-hour retention, then run the cleanup
        (once settled: cleanup spares what a transaction still running could precede)."""
        await self.settle()
        net = sql.Identifier(self.tracking_schema, net_table_name(table_config.schema, table_config.name))
        await self.admin.execute(
            sql.SQL("update {} set changed_at = changed_at - interval '2 hours'").format(net)
        )
        await self.source.cleanup(3600.0)

    def type_cases(self) -> Sequence[TypeCase]:
        return _PG_CASES

    async def key_values(self, kind: str) -> KeyValues:
        collation = _PG_COLLATIONS.get(kind)
        if collation is not None:
            found = await self.admin.execute("select 1 from pg_collation where collname = %s", [collation])
            if await found.fetchone() is None:
                pytest.skip(f"this PostgreSQL has no collation {collation!r} (built without ICU)")
        return PG_KEYS[kind]

    async def insert_literal_rows(self, table_config: TableConfig, rows: Sequence[Mapping[str, str]]) -> None:
        columns = list(rows[0])
        values = [
            sql.SQL("({})").format(sql.SQL(", ").join(sql.SQL(row[c]) for c in columns)) for row in rows
        ]
        await self.admin.execute(
            sql.SQL("insert into {} ({}) values {}").format(
                _name(table_config),
                sql.SQL(", ").join(map(sql.Identifier, columns)),
                sql.SQL(", ").join(values),
            )
        )
        await self.settle()

    async def ids_in_key_order(self, table_config: TableConfig, id_column: str) -> list[Any]:
        keys = sql.SQL(", ").join(map(sql.Identifier, self.keys[table_config.name]))
        query = sql.SQL("select {} from {} order by {}").format(
            sql.Identifier(id_column), _name(table_config), keys
        )
        return [row[0] for row in await (await self.admin.execute(query)).fetchall()]

    async def open_transactions(self) -> int | None:
        """Sessions of the sources (by their application_name) inside a transaction:
        pg_stat_activity.xact_start is set from its start to its end, whether a query
        runs or the session is 'idle in transaction'."""
        found = await self.admin.execute(
            "select count(*) from pg_stat_activity where application_name = %s and xact_start is not null",
            [self.application_name],
        )
        row = await found.fetchone()
        assert row is not None
        return int(row[0])

    @asynccontextmanager
    async def another_source(self) -> AsyncIterator[ChangeSource]:
        source = PostgresSource(self.source_config)
        await source.connect()
        try:
            yield source
        finally:
            await source.close()

    async def settle(self, timeout: float = 10.0) -> None:
        """Wait until every transaction id assigned so far is below a read's bound
        (autovacuum's analyze, say, can hold the bound for a moment)."""
        row = await (
            await self.admin.execute("select pg_snapshot_xmax(pg_current_snapshot())::text::bigint")
        ).fetchone()
        assert row is not None
        async with asyncio.timeout(timeout):
            while True:
                if await self.source.current_version() >= row[0] - 1:
                    return
                await asyncio.sleep(0.01)  # a server-side condition: polled


class PostgresLogicalHarness(PostgresHarness):
    """PostgreSQL with ``capture: logical`` (``cdc.sources.postgres_logical``): a
    publication and a replication slot per table, dropped at the end. Its
    sessions commit synchronously (the test server's default is off): a read's
    bound is the WAL flush position, which an asynchronous commit passes only
    at the WAL writer's next round (200 ms)."""

    kind = "postgres-logical"
    knows_changed_columns = False
    orders_changes_by_database_key = False

    def __init__(self, dsn: str, schema: str, admin: psycopg.AsyncConnection[TupleRow]) -> None:
        dsn = make_conninfo(dsn, options="-c synchronous_commit=on")
        super().__init__(dsn, schema, admin)
        self.source_config = dataclasses.replace(
            self.source_config,
            dsn=make_conninfo(self.source_config.dsn, options="-c synchronous_commit=on"),
            capture="logical",
            deployment=f"contract {self.application_name}",
        )
        self.pg_source = PostgresLogicalSource(self.source_config)
        self.source = self.pg_source
        self.tracked: list[TableConfig] = []

    @classmethod
    @asynccontextmanager
    async def running(cls, request: pytest.FixtureRequest) -> AsyncIterator[SourceHarness]:
        async with super().running(request) as harness:
            assert isinstance(harness, PostgresLogicalHarness)
            try:
                yield harness
            finally:
                await harness.source.tracking_disable(harness.tracked)

    async def create_table(
        self,
        name: str,
        columns: Mapping[str, str],
        key: Sequence[str],
        *,
        published: Sequence[str] | None = None,
        track: bool = True,
    ) -> TableConfig:
        table_config = await super().create_table(name, columns, key, published=published, track=False)
        if track:
            self.tracked.append(table_config)
            await self.source.tracking_enable([table_config])
        return table_config

    async def expire_tracking(self, table_config: TableConfig) -> None:
        """What retention means here: the slot moved past what a checkpoint holds
        (as after max_slot_wal_keep_size invalidated it and a snapshot made it again)."""
        await self.settle()
        slot = self.pg_source.slot(table_config.table, self.admin.info.dbname)
        await self.admin.execute("select pg_replication_slot_advance(%s, pg_current_wal_flush_lsn())", [slot])

    async def settle(self, timeout: float = 10.0) -> None:
        """Wait until the WAL is flushed up to where it is written now. (The server
        flushes an asynchronous commit within 200 ms, but not the records after
        the last commit: a synchronous commit here flushes everything before it.)"""
        row = await (
            await self.admin.execute("select (pg_current_wal_insert_lsn() - '0/0')::bigint")
        ).fetchone()
        assert row is not None
        await self.admin.execute("set synchronous_commit = on")
        await self.admin.execute(
            "select pg_current_xact_id()"
        )  # its commit is flushed, and the WAL before it
        async with asyncio.timeout(timeout):
            while True:
                if await self.source.current_version() >= row[0] - 1:
                    return
                await asyncio.sleep(0.01)  # a server-side condition: polled

    @asynccontextmanager
    async def another_source(self) -> AsyncIterator[ChangeSource]:
        source = PostgresLogicalSource(self.source_config)
        await source.connect()
        try:
            yield source
        finally:
            await source.close()


# -- SQL Server ----------------------------------------------------------------

_MSSQL_TYPES = {
    "int": "int",
    "bigint": "bigint",
    "text": "nvarchar(400)",  # not nvarchar(max): a logical text column may be in a primary key
    "decimal": "decimal(12,2)",
    "float": "float",
    "bool": "bit",
    "timestamp": "datetime2(7)",
    "timestamptz": "datetimeoffset(7)",
    "uuid": "uniqueidentifier",
    # case- and accent-sensitive; and a varchar of another code page (1251) than the
    # usual default collation's (SQL_Latin1_General_CP1_CI_AS: 1252)
    "ctext": "nvarchar(100) COLLATE Latin1_General_CS_AS",
    "cvarchar": "varchar(100) COLLATE Cyrillic_General_CS_AS",
}

# What differs from PostgreSQL's cases is SQL Server's own: money and smallmoney
# keep four decimals, datetime2(7)/time(7)/datetimeoffset(7) keep their seventh
# digit (read as the server's text: mssql_select), datetimeoffset keeps its
# offset, char and nchar are blank-padded. No rowversion or computed column: the all-NULL row
# could not hold them.
_MSSQL_CASES = (
    TypeCase("c_bit", "bit", "1", b"true"),
    TypeCase("c_tinyint", "tinyint", "255", b"255"),
    TypeCase("c_smallint", "smallint", "-32768", b"-32768"),
    TypeCase("c_int", "int", "2147483647", b"2147483647"),
    TypeCase("c_bigint", "bigint", "9223372036854775807", b"9223372036854775807"),
    TypeCase("c_decimal", "decimal(20,4)", "12345678901234.5600", b'"12345678901234.5600"'),
    TypeCase("c_numeric", "numeric(5,0)", "42", b'"42"'),
    TypeCase("c_money", "money", "12.5", b'"12.5000"'),
    TypeCase("c_smallmoney", "smallmoney", "1.25", b'"1.2500"'),
    TypeCase("c_real", "real", "1.5", b"1.5"),
    TypeCase("c_float", "float", "0.1", b"0.1"),
    TypeCase(
        "c_nvarchar",
        "nvarchar(50)",
        "N'h\u00e9llo \"w\u00f6rld\"' + NCHAR(10)",
        '"héllo \\"wörld\\"\\n"'.encode(),
    ),
    TypeCase("c_nvarchar_max", "nvarchar(max)", "N'\u00fcn\u00efcode'", '"ünïcode"'.encode()),
    TypeCase("c_varchar", "varchar(10)", "'abc'", b'"abc"'),
    TypeCase("c_char", "char(4)", "'ab'", b'"ab  "'),
    TypeCase("c_nchar", "nchar(2)", "N'\u00fc'", '"ü "'.encode()),
    TypeCase("c_text", "text", "'text'", b'"text"'),
    TypeCase("c_ntext", "ntext", "N'ntext'", b'"ntext"'),
    TypeCase("c_xml", "xml", "'<a b=\"1\"/>'", b'"<a b=\\"1\\"/>"'),
    TypeCase("c_binary", "binary(3)", "0x0001FF", b'"AAH/"'),
    TypeCase("c_varbinary", "varbinary(10)", "0x00FF10", b'"AP8Q"'),
    TypeCase("c_varbinary_max", "varbinary(max)", "0xCAFE", b'"yv4="'),
    TypeCase("c_image", "image", "0xBEEF", b'"vu8="'),
    TypeCase(
        "c_uuid",
        "uniqueidentifier",
        "'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11'",
        b'"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"',
    ),
    TypeCase("c_date", "date", "'2024-02-29'", b'"2024-02-29"'),
    TypeCase("c_time", "time(7)", "'13:45:30.1234567'", b'"13:45:30.1234567"'),
    TypeCase("c_time3", "time(3)", "'13:45:30.125'", b'"13:45:30.125000"'),
    TypeCase("c_datetime", "datetime", "'2024-02-29T13:45:30.123'", b'"2024-02-29T13:45:30.123000"'),
    TypeCase(
        "c_datetime2", "datetime2(7)", "'2024-02-29T13:45:30.1234567'", b'"2024-02-29T13:45:30.1234567"'
    ),
    TypeCase("c_hierarchyid", "hierarchyid", "'/1/2/'", b'"/1/2/"'),
    TypeCase("c_smalldatetime", "smalldatetime", "'2024-02-29T13:45:00'", b'"2024-02-29T13:45:00"'),
    TypeCase(
        "c_datetimeoffset",
        "datetimeoffset(7)",
        "'2024-02-29T13:45:30.5+02:00'",
        b'"2024-02-29T13:45:30.500000+02:00"',
    ),
)

# Expiring tracking on purpose cannot be done in test time: retention is at
# least one minute, and the cleanup (the automatic one every 30 minutes, or
# sys.sp_flush_CT_internal_table_on_demand) removes only what lies below the
# invalid-cleanup version the automatic cleanup last computed. TRUNCATE would
# raise the minimum valid version at once, but that is another event, with a
# contract test of its own: passing this test with it would prove nothing
# about retention.
MSSQL_NO_EXPIRY = (
    "SQL Server's retention cleanup cannot be forced in test time (CHANGE_RETENTION is at least "
    "1 minute, and cleanup only removes what the 30-minute automatic cleanup marked invalid); "
    "TRUNCATE, the one immediate expiry, is covered by test_truncate_expires_checkpoints_and_a_snapshot_recovers"
)

# DSNs whose database is set up for the session (snapshot isolation, change tracking)
_MSSQL_DATABASES: set[str] = set()


class MssqlSession:
    """A pyodbc connection and the one thread allowed to use it: pyodbc blocks,
    and a writer waiting for a row lock must not stop the event loop (the
    transaction holding the lock commits from it)."""

    def __init__(self, dsn: str, *, autocommit: bool) -> None:
        self.dsn, self.autocommit = dsn, autocommit
        self.conn: Any = None
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="contract-mssql")

    async def call(self, fn: Callable[[Any], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.executor, self._call, fn)

    def _call(self, fn: Callable[[Any], T]) -> T:
        if self.conn is None:
            self.conn = pyodbc.connect(self.dsn, autocommit=self.autocommit, timeout=30)
            self.conn.timeout = 60  # a lock wait the schedule did not foresee fails, never hangs
            register_converters(self.conn)
        return fn(self.conn)

    async def execute(self, statement: str, *params: Any) -> int:
        """Run a statement; return its row count."""
        return await self.call(lambda conn: conn.execute(statement, *params).rowcount)

    async def close(self) -> None:
        def close(conn: Any) -> None:
            conn.close()  # pyodbc rolls back what is still open
            self.conn = None

        try:
            if self.conn is not None:
                await self.call(close)
        finally:
            self.executor.shutdown(wait=False)


def _tsql_name(table_config: TableConfig) -> str:
    return mssql_sql.qualified(table_config.schema, table_config.name)


def _tsql_pairs(values: Mapping[str, Any], separator: str = " AND ") -> str:
    return separator.join(f"{mssql_sql.quote(c)} = ?" for c in values)


def _tsql_param(value: Any) -> Any:
    return value.isoformat() if isinstance(value, dt.datetime) and value.tzinfo is not None else value


class MssqlWriter(Writer):
    """One transaction (pyodbc autocommit off) on a connection and thread of its
    own. Locking READ COMMITTED, row locks only: an upsert is UPDATE, then
    INSERT when nothing was updated (no range locks, so a schedule that respects
    row locks never blocks), and UPDATE again should a concurrent insert of the
    same key win the race (a duplicate key ends the statement, not the
    transaction)."""

    def __init__(self, dsn: str, keys: Mapping[str, tuple[str, ...]]) -> None:
        self.session = MssqlSession(dsn, autocommit=False)
        self.keys = keys
        self.open = True

    async def take_version(self) -> None:
        """Nothing to take: SQL Server stamps a transaction's version at commit."""

    async def insert(self, table_config: TableConfig, row: Mapping[str, Any]) -> None:
        await self.session.execute(_tsql_insert(table_config, row), *map(_tsql_param, row.values()))

    async def upsert(self, table_config: TableConfig, row: Mapping[str, Any]) -> None:
        key = {c: row[c] for c in self.keys[table_config.name]}
        values = {c: v for c, v in row.items() if c not in key}
        for _ in range(10):
            if await self._update(table_config, key, values) > 0:
                return
            try:
                await self.insert(table_config, row)
                return
            except pyodbc.IntegrityError as exc:
                if "2627" not in str(exc) and "2601" not in str(exc):
                    raise  # not a duplicate key: a concurrent insert of it committed first
        raise AssertionError(f"upsert of {key} kept racing with concurrent writers")

    async def update(
        self, table_config: TableConfig, key: Mapping[str, Any], values: Mapping[str, Any]
    ) -> None:
        await self._update(table_config, key, values)

    async def _update(
        self, table_config: TableConfig, key: Mapping[str, Any], values: Mapping[str, Any]
    ) -> int:
        if not values:  # only a key: "update" it to itself, to lock and count it
            values = dict(key)
        statement = (
            f"UPDATE {_tsql_name(table_config)} SET {_tsql_pairs(values, ', ')} WHERE {_tsql_pairs(key)}"
        )
        return await self.session.execute(statement, *map(_tsql_param, [*values.values(), *key.values()]))

    async def delete(self, table_config: TableConfig, key: Mapping[str, Any]) -> None:
        statement = f"DELETE FROM {_tsql_name(table_config)} WHERE {_tsql_pairs(key)}"
        await self.session.execute(statement, *map(_tsql_param, key.values()))

    async def move(
        self, table_config: TableConfig, key: Mapping[str, Any], new_key: Mapping[str, Any]
    ) -> None:
        name = _tsql_name(table_config)
        statement = (
            f"UPDATE {name} SET {_tsql_pairs(new_key, ', ')} WHERE {_tsql_pairs(key)} "
            f"AND NOT EXISTS (SELECT 1 FROM {name} WHERE {_tsql_pairs(new_key)})"
        )
        params = [*new_key.values(), *key.values(), *new_key.values()]
        await self.session.execute(statement, *map(_tsql_param, params))

    async def commit(self) -> None:
        await self._end(lambda conn: conn.commit())

    async def rollback(self) -> None:
        await self._end(lambda conn: conn.rollback())

    async def _end(self, how: Callable[[Any], None]) -> None:
        try:
            if self.open and self.session.conn is not None:
                await self.session.call(how)
        finally:
            self.open = False
            await self.session.close()


def _tsql_insert(table_config: TableConfig, row: Mapping[str, Any]) -> str:
    columns = ", ".join(map(mssql_sql.quote, row))
    return f"INSERT INTO {_tsql_name(table_config)} ({columns}) VALUES ({', '.join('?' * len(row))})"


class MssqlHarness(SourceHarness):
    """SQL Server: the session's test database (``mssql_dsn``: CDC_TEST_MSSQL_DSN,
    or the CdcTest database of a testcontainers SQL Server), set up once with
    ALLOW_SNAPSHOT_ISOLATION and change tracking, and a schema of its own per
    test, dropped with its tables afterwards. Tables are tracked through the
    source's own ``tracking_enable`` (TRACK_COLUMNS_UPDATED = ON)."""

    kind = "mssql"
    # every system type is mirrored; only CLR user types are refused, and creating one needs
    # CREATE ASSEMBLY and 'clr enabled' (tests/cdc/sources/test_mssql_values.py refuses them offline)
    unsupported_type = None

    def __init__(self, dsn: str, schema: str, admin: MssqlSession) -> None:
        self.dsn = dsn
        self.schema = schema
        self.admin = admin  # autocommit, for DDL and reading contents
        self.keys: dict[str, tuple[str, ...]] = {}
        self.writers: list[MssqlWriter] = []  # rolled back at teardown, should a test fail midway
        # the sources' sessions, told apart in sys.dm_exec_sessions.program_name (ODBC's APP);
        # a DSN that names its own APP shares it with the harness's sessions, which hold no
        # transaction while a test counts them
        self.program_name = parse_dsn(dsn).get("APP") or f"contract-{uuid.uuid4().hex[:10]}"
        source_dsn = dsn if "APP" in parse_dsn(dsn) else f"{dsn.rstrip('; ')};APP={self.program_name}"
        self.source_config = SourceConfig(kind="mssql", dsn=source_dsn)
        self.mssql_source = MssqlSource(self.source_config)
        self.source = self.mssql_source

    @classmethod
    @asynccontextmanager
    async def running(cls, request: pytest.FixtureRequest) -> AsyncIterator[SourceHarness]:
        dsn = request.getfixturevalue("mssql_dsn")  # skipped, with the reason, where no SQL Server is
        admin = MssqlSession(dsn, autocommit=True)
        harness = cls(dsn, "c" + uuid.uuid4().hex[:10], admin)
        try:
            if dsn not in _MSSQL_DATABASES:
                await admin.call(_mssql_database_setup)
                _MSSQL_DATABASES.add(dsn)
            await admin.execute(f"CREATE SCHEMA {mssql_sql.quote(harness.schema)}")
            await harness.source.connect()
            yield harness
        finally:
            for writer in harness.writers:
                await writer.rollback()
            await harness.source.close()
            await admin.call(lambda conn: _mssql_drop_schema(conn, harness.schema))
            await admin.close()

    async def create_table(
        self,
        name: str,
        columns: Mapping[str, str],
        key: Sequence[str],
        *,
        published: Sequence[str] | None = None,
        track: bool = True,
    ) -> TableConfig:
        table_config = make_table_config(self.schema, name, published)
        definitions = [
            f"{mssql_sql.quote(column)} {_MSSQL_TYPES.get(kind, kind)}{' NOT NULL' if column in key else ''}"
            for column, kind in columns.items()
        ]
        if key:
            definitions.append(f"PRIMARY KEY ({', '.join(map(mssql_sql.quote, key))})")
        await self.admin.execute(f"CREATE TABLE {_tsql_name(table_config)} ({', '.join(definitions)})")
        self.keys[name] = tuple(key)
        if track:
            await self.source.tracking_enable([table_config])
        return table_config

    async def begin(self) -> Writer:
        writer = MssqlWriter(self.dsn, self.keys)
        self.writers = [w for w in self.writers if w.open] + [writer]
        return writer

    async def rows(self, table_config: TableConfig) -> dict[Key, dict[str, Any]]:
        """Read in a SNAPSHOT transaction: the committed contents, without waiting
        for the row locks of transactions still open."""

        def read(conn: Any) -> list[dict[str, Any]]:
            conn.execute("SET TRANSACTION ISOLATION LEVEL SNAPSHOT")
            conn.execute("BEGIN TRANSACTION")
            try:
                cursor = conn.execute(f"SELECT * FROM {_tsql_name(table_config)}")
                names = [d[0] for d in cursor.description]
                contents = [dict(zip(names, r, strict=True)) for r in cursor.fetchall()]
            finally:
                conn.execute("COMMIT TRANSACTION")
                conn.execute("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
            return contents

        contents = await self.admin.call(read)
        return {tuple(r[k] for k in self.keys[table_config.name]): r for r in contents}

    async def insert_literals(self, table_config: TableConfig, row: Mapping[str, str]) -> None:
        columns = ", ".join(map(mssql_sql.quote, row))
        await self.admin.execute(
            f"INSERT INTO {_tsql_name(table_config)} ({columns}) VALUES ({', '.join(row.values())})"
        )

    async def truncate(self, table_config: TableConfig) -> None:
        await self.admin.execute(f"TRUNCATE TABLE {_tsql_name(table_config)}")

    async def expire_tracking(self, table_config: TableConfig) -> None:
        pytest.skip(MSSQL_NO_EXPIRY)

    def type_cases(self) -> Sequence[TypeCase]:
        return _MSSQL_CASES

    async def key_values(self, kind: str) -> KeyValues:
        return MSSQL_KEYS[kind]

    async def insert_literal_rows(self, table_config: TableConfig, rows: Sequence[Mapping[str, str]]) -> None:
        """One INSERT statement: one transaction, one change-tracking version."""
        await self.admin.execute(mssql_insert_literal_rows(table_config, rows))

    async def ids_in_key_order(self, table_config: TableConfig, id_column: str) -> list[Any]:
        statement = mssql_ids_in_key_order(table_config, id_column, self.keys[table_config.name])
        rows = await self.admin.call(lambda conn: conn.execute(statement).fetchall())
        return [row[0] for row in rows]

    async def open_transactions(self) -> int | None:
        """Sessions of the sources (by program_name) with a transaction open, or an
        active snapshot transaction ("sys.dm_exec_sessions": open_transaction_count;
        "sys.dm_tran_active_snapshot_database_transactions", learn.microsoft.com;
        both need VIEW SERVER STATE, or VIEW SERVER PERFORMANCE STATE from 2022)."""
        try:
            count = await self.admin.call(
                lambda conn: conn.execute(MSSQL_OPEN_TRANSACTIONS, self.program_name).fetchone()
            )
        except pyodbc.Error as exc:  # 300: "VIEW SERVER STATE permission was denied ..."
            if "permission was denied" not in str(exc):
                raise
            pytest.skip(f"the test login cannot see other sessions' transactions: {exc}")
        return int(count[0])

    @asynccontextmanager
    async def another_source(self) -> AsyncIterator[ChangeSource]:
        source = MssqlSource(self.source_config)
        await source.connect()
        try:
            yield source
        finally:
            await source.close()

    async def settle(self) -> None:
        """Nothing to wait for: a transaction's version is stamped at commit, so
        CHANGE_TRACKING_CURRENT_VERSION() covers every commit that returned."""


MSSQL_OPEN_TRANSACTIONS = (
    "SELECT COUNT(*) AS sessions FROM sys.dm_exec_sessions AS s WHERE s.program_name = ? "
    "AND (s.open_transaction_count > 0 OR EXISTS (SELECT 1 FROM sys.dm_tran_active_snapshot_database_transactions "
    "AS a WHERE a.session_id = s.session_id))"
)


def mssql_insert_literal_rows(table_config: TableConfig, rows: Sequence[Mapping[str, str]]) -> str:
    """One multi-row INSERT (a table value constructor takes 1000 rows at most:
    "Table Value Constructor (Transact-SQL)", learn.microsoft.com)."""
    assert 0 < len(rows) <= 1000
    columns = list(rows[0])
    values = ", ".join("(" + ", ".join(row[c] for c in columns) + ")" for row in rows)
    return (
        f"INSERT INTO {_tsql_name(table_config)} ({', '.join(map(mssql_sql.quote, columns))}) VALUES {values}"
    )


def mssql_ids_in_key_order(table_config: TableConfig, id_column: str, key: Sequence[str]) -> str:
    order = ", ".join(map(mssql_sql.quote, key))
    return f"SELECT {mssql_sql.quote(id_column)} FROM {_tsql_name(table_config)} ORDER BY {order}"


def _mssql_database_setup(conn: Any) -> None:
    """Snapshot isolation and change tracking for the session's test database
    (what `cdc tracking enable` does too; here once, so that tables created
    untracked live in a database that tracks)."""
    snapshot, tracking = conn.execute(
        "SELECT d.snapshot_isolation_state, CHANGE_TRACKING_CURRENT_VERSION() FROM sys.databases AS d "
        "WHERE d.database_id = DB_ID()"
    ).fetchone()
    if snapshot in (0, 2):
        conn.execute(mssql_sql.ENABLE_SNAPSHOT_ISOLATION.sql)
    if tracking is None:
        conn.execute(mssql_sql.enable_database_tracking(2 * 86400).sql)


def _mssql_drop_schema(conn: Any, schema: str) -> None:
    tables = conn.execute(
        "SELECT t.name FROM sys.tables AS t WHERE t.schema_id = SCHEMA_ID(?)", schema
    ).fetchall()
    for (name,) in tables:
        conn.execute(f"DROP TABLE {mssql_sql.qualified(schema, name)}")
    conn.execute(f"DROP SCHEMA IF EXISTS {mssql_sql.quote(schema)}")


# -- in memory -----------------------------------------------------------------

_MEMORY_TYPES = {
    "int": "int",
    "bigint": "bigint",
    "text": "text",
    "decimal": "decimal",
    "float": "float",
    "bool": "bool",
    "timestamp": "datetime",
    "timestamptz": "datetime",
    "uuid": "uuid",
}

# A literal is a Python expression over these names (the "dialect" of the memory source).
_MEMORY_NAMES: dict[str, Any] = {"Decimal": decimal.Decimal, "dt": dt, "UUID": uuid.UUID}

_MEMORY_CASES = (
    TypeCase("c_int", "int", "2147483647", b"2147483647"),
    TypeCase("c_bigint", "bigint", "9223372036854775807", b"9223372036854775807"),
    TypeCase("c_decimal", "decimal", "Decimal('12345678901234.5600')", b'"12345678901234.5600"'),
    TypeCase("c_float", "float", "0.1", b"0.1"),
    TypeCase("c_bool", "bool", "True", b"true"),
    TypeCase("c_text", "text", "'h\\u00e9llo \"w\\u00f6rld\"\\n'", '"héllo \\"wörld\\"\\n"'.encode()),
    TypeCase("c_bytes", "bytes", "b'\\x00\\xff\\x10'", b'"AP8Q"'),
    TypeCase(
        "c_uuid",
        "uuid",
        "UUID('A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11')",
        b'"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"',
    ),
    TypeCase("c_date", "date", "dt.date(2024, 2, 29)", b'"2024-02-29"'),
    TypeCase(
        "c_datetime",
        "datetime",
        "dt.datetime(2024, 2, 29, 13, 45, 30, 500000)",
        b'"2024-02-29T13:45:30.500000"',
    ),
    TypeCase("c_json", "json", "{'b': 1, 'a': [1.5, None, 'x']}", b'{"b":1,"a":[1.5,null,"x"]}'),
)


class MemoryWriter(Writer):
    """A ``MemoryTransaction``: its writes are applied at once at commit. Each
    statement yields to the event loop first, as a round trip to a server
    would: concurrent writers and readers interleave, as they do on a database."""

    def __init__(self, transaction: MemoryTransaction) -> None:
        self.transaction = transaction

    async def take_version(self) -> None:
        """Nothing to take: the memory source stamps a transaction's version at commit."""

    async def insert(self, table_config: TableConfig, row: Mapping[str, Any]) -> None:
        await asyncio.sleep(0)
        self.transaction.insert(table_config.table, row)

    async def upsert(self, table_config: TableConfig, row: Mapping[str, Any]) -> None:
        await asyncio.sleep(0)
        self.transaction.upsert(table_config.table, row)

    async def update(
        self, table_config: TableConfig, key: Mapping[str, Any], values: Mapping[str, Any]
    ) -> None:
        await asyncio.sleep(0)
        self.transaction.update(table_config.table, key, values)

    async def delete(self, table_config: TableConfig, key: Mapping[str, Any]) -> None:
        await asyncio.sleep(0)
        self.transaction.delete(table_config.table, key)

    async def move(
        self, table_config: TableConfig, key: Mapping[str, Any], new_key: Mapping[str, Any]
    ) -> None:
        await asyncio.sleep(0)
        self.transaction.move(table_config.table, key, new_key)

    async def commit(self) -> None:
        await asyncio.sleep(0)
        self.transaction.commit()

    async def rollback(self) -> None:
        self.transaction.rollback()


class MemoryHarness(SourceHarness):
    """The in-memory source (``cdc.sources.memory``): no server, a schema name for form's sake."""

    kind = "memory"
    unsupported_type = "opaque"

    def __init__(self) -> None:
        self.memory = MemorySource()
        self.source = self.memory
        self.schema = "mem"

    @classmethod
    @asynccontextmanager
    async def running(cls, request: pytest.FixtureRequest) -> AsyncIterator[SourceHarness]:
        harness = cls()
        await harness.source.connect()
        try:
            yield harness
        finally:
            await harness.source.close()

    async def create_table(
        self,
        name: str,
        columns: Mapping[str, str],
        key: Sequence[str],
        *,
        published: Sequence[str] | None = None,
        track: bool = True,
    ) -> TableConfig:
        table_config = make_table_config(self.schema, name, published)
        self.memory.create_table(
            table_config.table, {c: _MEMORY_TYPES.get(k, k) for c, k in columns.items()}, key
        )
        if track:
            await self.source.tracking_enable([table_config])
        return table_config

    async def begin(self) -> Writer:
        return MemoryWriter(self.memory.begin())

    async def rows(self, table_config: TableConfig) -> dict[Key, dict[str, Any]]:
        return self.memory.rows(table_config.table)

    async def insert_literals(self, table_config: TableConfig, row: Mapping[str, str]) -> None:
        # the literals are this suite's own constants, Python expressions over _MEMORY_NAMES
        self.memory.insert(table_config.table, {c: eval(v, dict(_MEMORY_NAMES)) for c, v in row.items()})

    async def truncate(self, table_config: TableConfig) -> None:
        self.memory.truncate(table_config.table)

    async def expire_tracking(self, table_config: TableConfig) -> None:
        """Retention zero: every entry tracked so far is older than it."""
        await self.source.cleanup(0.0)

    def type_cases(self) -> Sequence[TypeCase]:
        return _MEMORY_CASES

    async def key_values(self, kind: str) -> KeyValues:
        if kind not in MEMORY_KEYS:  # a test that asks is parametrized wrongly (key_values.COLLATED_KINDS)
            raise LookupError(f"the memory source has no {kind!r} keys: it has no collations")
        return MEMORY_KEYS[kind]

    async def insert_literal_rows(self, table_config: TableConfig, rows: Sequence[Mapping[str, str]]) -> None:
        transaction = self.memory.begin()
        for row in rows:  # this suite's own constants, Python expressions over _MEMORY_NAMES
            transaction.insert(table_config.table, {c: eval(v, dict(_MEMORY_NAMES)) for c, v in row.items()})
        transaction.commit()

    async def ids_in_key_order(self, table_config: TableConfig, id_column: str) -> list[Any]:
        return [row[id_column] for _, row in sorted(self.memory.rows(table_config.table).items())]

    async def open_transactions(self) -> int | None:
        return None  # nothing to hold: a read is a function call

    @asynccontextmanager
    async def another_source(self) -> AsyncIterator[ChangeSource]:
        yield self.memory  # the database itself: it keeps no read between calls

    async def settle(self) -> None:
        """Nothing to wait for: a commit that returned is within the current version."""


HarnessFactory = Callable[[pytest.FixtureRequest], AbstractAsyncContextManager[SourceHarness]]

# kind -> factory; the contract suite runs once per entry.
HARNESSES: dict[str, HarnessFactory] = {
    "memory": MemoryHarness.running,
    "postgres": PostgresHarness.running,
    "postgres-logical": PostgresLogicalHarness.running,
    "mssql": MssqlHarness.running,
}


# -- dialect-free helpers ------------------------------------------------------


def key_of(info: TableInfo, values: Mapping[str, Any]) -> Key:
    return tuple(values[k] for k in info.primary_key)


async def read_all(
    source: ChangeSource, info: TableInfo, since: int, limit: int = 1000
) -> tuple[list[ChangeRow], int]:
    """One complete read from ``since``, following pages: the rows and the new checkpoint."""
    page = await source.read_changes(info, since, limit=limit)
    rows = list(page.rows)
    while page.more:
        page = await source.read_changes(info, since, limit=limit, upto=page.next_version, after=page.cursor)
        rows += page.rows
    return rows, page.next_version


class Replica:
    """A table rebuilt the way the tracker does it: a snapshot, then every read's
    net changes from the last checkpoint, applied in order."""

    def __init__(self, source: ChangeSource, info: TableInfo, version: int) -> None:
        self.source, self.info, self.version = source, info, version
        self.rows: dict[Key, dict[str, Any]] = {}

    @classmethod
    async def from_snapshot(cls, source: ChangeSource, info: TableInfo, page_size: int = 7) -> Replica:
        pages: list[SnapshotPage] = [p async for p in source.snapshot(info, page_size=page_size)]
        replica = cls(source, info, pages[0].version)
        for page in pages:
            assert page.version == replica.version
            for row in page.rows:
                replica.rows[key_of(info, row)] = row
        return replica

    def apply(self, rows: Sequence[ChangeRow]) -> None:
        for row in rows:
            key = key_of(self.info, row.key)
            assert self.version < row.version, f"{row} is not after the checkpoint {self.version}"
            if row.op == "D":
                self.rows.pop(key, None)
                continue
            assert row.values is not None
            if row.op == "U":
                assert key in self.rows, f"U for {key}, which did not exist at {self.version}"
            self.rows[key] = row.values

    async def catch_up(self, limit: int = 1000) -> list[ChangeRow]:
        """Read and apply everything after the checkpoint; advance it."""
        rows, next_version = await read_all(self.source, self.info, self.version, limit)
        assert next_version >= self.version
        assert all(r.version <= next_version for r in rows)
        self.apply(rows)
        self.version = next_version
        return rows
