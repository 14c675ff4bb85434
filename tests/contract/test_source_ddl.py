"""The ChangeSource contract while tables change shape (issue 12): what the
tracker relies on to follow a table without a restart, for every source with
a DDL adapter below.

- ``fingerprints`` changes when, and only when, the shape or the tracking of
  a table changes (not with writes, cleanup or TRUNCATE), and is None for a
  table that is not there; ``describe`` carries the fingerprint it saw;
- ``describe`` gives the new columns, and a new ``identity`` to a table
  dropped and created again;
- reads and snapshots with a ``TableInfo`` whose columns are gone raise
  ``SchemaError``; with the new one they work;
- columns whose names start with ``@`` are left out (or a key refused).

A source joins by adding its ``Ddl`` to ``DDL`` (its dialect's statements);
the harness fixture runs every test once per entry.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator

import pytest
from psycopg import sql

from cdc.config import TableConfig
from cdc.errors import SchemaError
from cdc.sources import mssql_sql
from cdc.sources.base import TableInfo

from .harness import (
    HARNESSES,
    MemoryHarness,
    MssqlHarness,
    PostgresHarness,
    Replica,
    SourceHarness,
    _tsql_name,
    make_table_config,
)

ITEMS = {"id": "int", "n": "int", "note": "text"}


class Ddl(abc.ABC):
    """One dialect's DDL steps; each returns once a read would see the result."""

    @abc.abstractmethod
    async def add_column(self, table_config: TableConfig, column: str, default: int | None) -> None:
        """Add an integer column, with ``default`` in every row when given."""

    @abc.abstractmethod
    async def drop_column(self, table_config: TableConfig, column: str) -> None: ...

    @abc.abstractmethod
    async def rename_column(self, table_config: TableConfig, column: str, new_name: str) -> None: ...

    @abc.abstractmethod
    async def drop_table(self, table_config: TableConfig) -> None: ...

    @abc.abstractmethod
    async def rename_table(self, table_config: TableConfig, new_name: str) -> None: ...


class PostgresDdl(Ddl):
    def __init__(self, harness: PostgresHarness) -> None:
        self.harness = harness

    async def _run(self, statement: sql.Composable) -> None:
        await self.harness.admin.execute(statement)
        await self.harness.settle()

    @staticmethod
    def _table(table_config: TableConfig) -> sql.Identifier:
        return sql.Identifier(table_config.schema, table_config.name)

    async def add_column(self, table_config: TableConfig, column: str, default: int | None) -> None:
        fill = sql.SQL("") if default is None else sql.SQL(" default {}").format(sql.Literal(default))
        await self._run(
            sql.SQL("alter table {} add column {} integer{}").format(
                self._table(table_config), sql.Identifier(column), fill
            )
        )

    async def drop_column(self, table_config: TableConfig, column: str) -> None:
        await self._run(
            sql.SQL("alter table {} drop column {}").format(self._table(table_config), sql.Identifier(column))
        )

    async def rename_column(self, table_config: TableConfig, column: str, new_name: str) -> None:
        await self._run(
            sql.SQL("alter table {} rename column {} to {}").format(
                self._table(table_config), sql.Identifier(column), sql.Identifier(new_name)
            )
        )

    async def drop_table(self, table_config: TableConfig) -> None:
        await self._run(sql.SQL("drop table {}").format(self._table(table_config)))

    async def rename_table(self, table_config: TableConfig, new_name: str) -> None:
        await self._run(
            sql.SQL("alter table {} rename to {}").format(self._table(table_config), sql.Identifier(new_name))
        )


class MemoryDdl(Ddl):
    def __init__(self, harness: MemoryHarness) -> None:
        self.memory = harness.memory

    async def add_column(self, table_config: TableConfig, column: str, default: int | None) -> None:
        self.memory.add_column(table_config.table, column, "int", default)

    async def drop_column(self, table_config: TableConfig, column: str) -> None:
        self.memory.drop_column(table_config.table, column)

    async def rename_column(self, table_config: TableConfig, column: str, new_name: str) -> None:
        self.memory.rename_column(table_config.table, column, new_name)

    async def drop_table(self, table_config: TableConfig) -> None:
        self.memory.drop_table(table_config.table)

    async def rename_table(self, table_config: TableConfig, new_name: str) -> None:
        self.memory.rename_table(table_config.table, f"{table_config.schema}.{new_name}")


class MssqlDdl(Ddl):
    """T-SQL: ``ADD ... DEFAULT ... WITH VALUES`` fills the existing rows (as
    PostgreSQL's ``ADD COLUMN ... DEFAULT`` does; without ``WITH VALUES`` a
    nullable column's rows stay NULL), renames go through ``sp_rename``,
    whose object names are bracket-quoted inside a string literal."""

    def __init__(self, harness: MssqlHarness) -> None:
        self.admin = harness.admin

    @staticmethod
    def _literal(text: str) -> str:
        return "N'" + text.replace("'", "''") + "'"

    async def add_column(self, table_config: TableConfig, column: str, default: int | None) -> None:
        fill = "" if default is None else f" DEFAULT {int(default)} WITH VALUES"
        await self.admin.execute(
            f"ALTER TABLE {_tsql_name(table_config)} ADD {mssql_sql.quote(column)} int NULL{fill}"
        )

    async def drop_column(self, table_config: TableConfig, column: str) -> None:
        await self.admin.execute(
            f"ALTER TABLE {_tsql_name(table_config)} DROP COLUMN {mssql_sql.quote(column)}"
        )

    async def rename_column(self, table_config: TableConfig, column: str, new_name: str) -> None:
        old = self._literal(f"{_tsql_name(table_config)}.{mssql_sql.quote(column)}")
        await self.admin.execute(f"EXEC sp_rename {old}, {self._literal(new_name)}, N'COLUMN'")

    async def drop_table(self, table_config: TableConfig) -> None:
        await self.admin.execute(f"DROP TABLE {_tsql_name(table_config)}")

    async def rename_table(self, table_config: TableConfig, new_name: str) -> None:
        await self.admin.execute(
            f"EXEC sp_rename {self._literal(_tsql_name(table_config))}, {self._literal(new_name)}"
        )


def _ddl(harness: SourceHarness) -> Ddl:
    if isinstance(harness, PostgresHarness):
        return PostgresDdl(harness)
    if isinstance(harness, MssqlHarness):
        return MssqlDdl(harness)
    assert isinstance(harness, MemoryHarness)
    return MemoryDdl(harness)


# kind -> whether the contract's DDL steps run there
DDL = ("memory", "mssql", "postgres", "postgres-logical")


@pytest.fixture(params=[kind for kind in sorted(HARNESSES) if kind in DDL])
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[SourceHarness]:
    async with HARNESSES[request.param](request) as running:
        yield running


async def items(harness: SourceHarness) -> tuple[TableConfig, TableInfo]:
    table_config = await harness.create_table("items", ITEMS, ["id"])
    async with harness.writer() as writer:
        for i in (1, 2, 3):
            await writer.insert(table_config, {"id": i, "n": i, "note": f"n{i}"})
    return table_config, await harness.source.describe(table_config)


async def fingerprint(harness: SourceHarness, table_config: TableConfig) -> str | None:
    return (await harness.source.fingerprints([table_config]))[table_config.table]


async def test_fingerprints_change_with_the_shape_not_with_writes(harness: SourceHarness) -> None:
    table_config, info = await items(harness)
    missing = make_table_config(harness.schema, "missing")
    before = await harness.source.fingerprints([table_config, missing])

    async with harness.writer() as writer:
        await writer.update(table_config, {"id": 1}, {"n": 10})
        await writer.delete(table_config, {"id": 2})
    await harness.truncate(table_config)
    await harness.settle()

    assert await harness.source.fingerprints([table_config, missing]) == before
    assert before == {table_config.table: info.fingerprint, missing.table: None}
    assert info.fingerprint

    await _ddl(harness).add_column(table_config, "d", None)

    assert await fingerprint(harness, table_config) not in (None, info.fingerprint)


async def test_describe_follows_added_dropped_and_renamed_columns(harness: SourceHarness) -> None:
    table_config, info = await items(harness)
    ddl = _ddl(harness)
    seen = {info.fingerprint}

    for step, expected in (
        (ddl.add_column(table_config, "d", 7), ("id", "n", "note", "d")),
        (ddl.drop_column(table_config, "note"), ("id", "n", "d")),
        (ddl.rename_column(table_config, "n", "m"), ("id", "m", "d")),
    ):
        await step
        described = await harness.source.describe(table_config)
        assert described.column_names == expected
        assert described.identity == info.identity
        assert described.fingerprint == await fingerprint(harness, table_config)
        assert described.fingerprint not in seen
        seen.add(described.fingerprint)

    replica = await Replica.from_snapshot(harness.source, described)
    assert sorted(replica.rows.values(), key=lambda r: r["id"]) == [
        {"id": i, "m": i, "d": 7} for i in (1, 2, 3)
    ]


async def test_old_info_reads_fail_with_schema_error_and_the_new_info_reads(harness: SourceHarness) -> None:
    table_config, info = await items(harness)
    replica = await Replica.from_snapshot(harness.source, info)

    await _ddl(harness).drop_column(table_config, "note")
    async with harness.writer() as writer:
        await writer.update(table_config, {"id": 1}, {"n": 10})

    with pytest.raises(SchemaError):
        await harness.source.read_changes(info, replica.version, limit=100)
    with pytest.raises(SchemaError):
        [page async for page in harness.source.snapshot(info, page_size=10)]
    replica.info = await harness.source.describe(table_config)
    assert [(r.op, r.values) for r in await replica.catch_up()] == [("U", {"id": 1, "n": 10})]


async def test_a_table_dropped_or_renamed_is_gone_and_created_again_is_another(
    harness: SourceHarness,
) -> None:
    table_config, info = await items(harness)
    ddl = _ddl(harness)

    await ddl.rename_table(table_config, "items2")
    assert await fingerprint(harness, table_config) is None
    with pytest.raises(SchemaError):
        await harness.source.describe(table_config)
    await ddl.rename_table(make_table_config(harness.schema, "items2"), "items")
    assert await fingerprint(harness, table_config) == info.fingerprint

    await ddl.drop_table(table_config)
    assert await fingerprint(harness, table_config) is None
    with pytest.raises(SchemaError):
        await harness.source.describe(table_config)
    await harness.create_table("items", ITEMS, ["id"], track=False)

    again = await harness.source.describe(table_config)
    assert again.identity != info.identity and again != info
    assert await fingerprint(harness, table_config) == again.fingerprint != info.fingerprint
    assert (await harness.source.tracking_status([table_config]))[0].min_valid_version is None


async def test_tracking_disabled_changes_the_fingerprint(harness: SourceHarness) -> None:
    table_config, info = await items(harness)

    await harness.source.tracking_disable([table_config])

    assert await fingerprint(harness, table_config) not in (None, info.fingerprint)
    assert (await harness.source.tracking_status([table_config]))[0].min_valid_version is None


async def test_reserved_columns_are_left_out_and_a_reserved_key_refused(harness: SourceHarness) -> None:
    flags = await harness.create_table("flags", {"id": "int", "@flag": "bool", "n": "int"}, ["id"])
    odd = await harness.create_table("odd", {"@id": "int", "n": "int"}, ["@id"], track=False)

    info = await harness.source.describe(flags)

    assert info.column_names == ("id", "n") and info.left_out == ("@flag",)
    with pytest.raises(SchemaError, match="@id.*names starting with @ are reserved"):
        await harness.source.describe(odd)
