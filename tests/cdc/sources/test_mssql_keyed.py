"""Reading SQL Server rows by primary key (``cdc deadletter replay``): the
T-SQL parsed by sqlglot's tsql dialect here; against a real server when
CDC_TEST_MSSQL_DSN points at one (skipped with the reason otherwise)."""

from __future__ import annotations

import pytest
import sqlglot
from sqlglot import exp

from cdc.config import TableConfig
from cdc.sources import mssql_keyed
from cdc.sources import mssql_sql as sql
from cdc.sources.mssql import MssqlSource
from tests.cdc.sources.test_mssql_live import admin, run, source, table, tracked  # noqa: F401  (fixtures)

SHAPES = (
    sql.TableShape(
        "dbo",
        "T",
        ("Id",),
        ("int",),
        ("Id", "Price", "At"),
        column_types=("int", "decimal(12,2)", "datetime2(7)"),
    ),
    sql.TableShape(
        "we]ird",
        "Or[ders] x",
        ("a]b", "Line", "Bin", "At"),
        ("varchar(10)", "int", "varbinary(16)", "datetime2(7)"),
        ("a]b", "Line", "Bin", "At", "x'); DROP TABLE t; --"),
        key_collations=("Cyrillic_General_CI_AS", None, None, None),
    ),
)


@pytest.mark.parametrize("shape", SHAPES, ids=["simple", "hostile"])
def test_the_row_by_key_statement_parses_and_casts_each_key_to_its_type(shape: sql.TableShape) -> None:
    key = ["k", 2, "00ff", "2024-02-29T13:45:30.1234567"][: len(shape.primary_key)]
    if len(shape.primary_key) == 1:
        key = [7]
    statement = mssql_keyed.row_by_key(shape, key)
    tree = sqlglot.parse_one(statement.sql, read="tsql")
    assert len(list(tree.find_all(exp.Placeholder))) == len(statement.params) == len(shape.primary_key)
    assert f"FROM {shape.qualified} AS t WHERE" in statement.sql
    for declared in shape.key_types:
        assert f"AS {declared})" in statement.sql
    if len(shape.primary_key) > 1:
        assert "CAST(? COLLATE Cyrillic_General_CI_AS AS varchar(10))" in statement.sql
        assert statement.params[2] == bytes.fromhex("00ff"), "a binary key renders as hex: decoded"


def test_the_transaction_statements_parse() -> None:
    for text in (sql.BEGIN, sql.COMMIT, sql.CURRENT_VERSION.sql, sql.min_valid_version("dbo", "T").sql):
        sqlglot.parse_one(text, read="tsql")


async def test_rows_by_key_on_a_real_server(
    source: MssqlSource,  # noqa: F811
    table: TableConfig,  # noqa: F811
    mssql_dsn: str,
) -> None:
    """The version comes first: a row changed after the read has a higher version."""
    info = await tracked(source, table)
    run(mssql_dsn, f"INSERT INTO {table.table} (Id, Price, Status) VALUES (1, 1.50, 'a'), (2, 2.50, 'b')")
    before = await source.current_version()
    found = await source.read_rows(info, [{"Id": "2"}, {"Id": 9}, {"Id": 1}])
    assert found.version >= before
    assert [r and (r["Id"], r["Status"]) for r in found.rows] == [(2, "b"), None, (1, "a")]
    run(mssql_dsn, f"UPDATE {table.table} SET Status = 'later' WHERE Id = 1")
    assert await source.current_version() > found.version
